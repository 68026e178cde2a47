"""`manage.py device_pki`: create this deployment's own device CA and gateway certificate, once.

Production never generates them implicitly (ferry_cloud/device_ca.py); an operator runs this
(compose's `setup` does) or points FERRY_DEVICE_CA_* and FERRY_GATEWAY_TLS_* at files made
by their own PKI. Existing files are kept. `--bundle TOKEN` prints the enrolment bundle line
for a token instead.
"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand
from ferry_cloud.device_ca import device_ca_certificate, ensure_pki_files
from fleet.services import enrolment_bundle

from deploy.trust.certificates import fingerprint


class Command(BaseCommand):
    help = "Create the device CA and the gateway's TLS certificate if missing; print the CA fingerprint."

    def add_arguments(self, parser):
        parser.add_argument(
            "--names",
            default=",".join(settings.FERRY_GATEWAY_TLS_NAMES),
            help="DNS names and IP addresses devices dial the gateway by (comma-separated)",
        )
        parser.add_argument("--bundle", default="", metavar="TOKEN", help="print the bundle for this token")
        parser.add_argument("--gateway", default="127.0.0.1:50051", help="mutual-TLS host:port, for --bundle")
        parser.add_argument("--enrol", default="127.0.0.1:50052", help="enrolment host:port, for --bundle")

    def handle(self, *args, names, bundle, gateway, enrol, **options):
        if bundle:
            self.stdout.write(enrolment_bundle(token=bundle, gateway_address=gateway, enrol_address=enrol))
            return
        ensure_pki_files(
            ca_cert=Path(settings.FERRY_DEVICE_CA_CERT_FILE),
            ca_key=Path(settings.FERRY_DEVICE_CA_KEY_FILE),
            server_cert=Path(settings.FERRY_GATEWAY_TLS_CERT_FILE),
            server_key=Path(settings.FERRY_GATEWAY_TLS_KEY_FILE),
            names=[n.strip() for n in names.split(",") if n.strip()],
        )
        self.stdout.write(f"device CA sha256 {fingerprint(device_ca_certificate())}")
