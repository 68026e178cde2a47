from django.conf import settings
from django.db import models


class Organisation(models.Model):
    """A tenant: it owns models, devices and releases; every query is scoped to one."""

    name = models.CharField(max_length=200, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        """What a member may do; each role may do everything the ones below it may.

        viewer: read only. release_manager (the operator): models, versions, releases and their
        actions, pins, device groups. admin: also enrolment tokens, device revocation and, when
        they get doors, members, API tokens and keys. The stored value keeps its first name,
        ``release_manager``: the docs call it operator, and renaming a stored value buys nothing.
        """

        ADMIN = "admin", "Admin"
        RELEASE_MANAGER = "release_manager", "Release manager"
        VIEWER = "viewer", "Viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=32, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "organisation"], name="one_membership_per_org")
        ]

    def has_role(self, required: str) -> bool:
        """Whether this member's role is ``required`` or above it."""
        return ROLE_RANK.get(self.role, -1) >= ROLE_RANK[required]


# Lowest first: the ranking has_role compares. An unknown stored value ranks below viewer.
ROLE_RANK: dict[str, int] = {
    Membership.Role.VIEWER: 0,
    Membership.Role.RELEASE_MANAGER: 1,
    Membership.Role.ADMIN: 2,
}


class ApiToken(models.Model):
    """A REST credential: shown once as ``fat_<id>_<secret>``, kept only as the secret's sha256.

    The id finds the row; the hash is compared in constant time. Its role caps the user's role
    in the organisation (never raises it), and it stops working at expires_at or revoked_at.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=200, blank=True)
    role = models.CharField(max_length=32, choices=Membership.Role.choices)
    secret_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
