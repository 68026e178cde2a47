"""Maintenance windows: a cron schedule opens a window of some duration, in a time zone.

A window ``{"cron": "0 2 * * *", "duration_seconds": 7200, "timezone": "Europe/Berlin"}``
is open from 02:00 to 04:00 Berlin time every day. Devices get the window with their
offer and activate (switch to) the new version only inside it; downloading may happen
at any time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from deploy.errors import PolicyError

MAX_DURATION_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class MaintenanceWindow:
    cron: str
    duration_seconds: int
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
            raise PolicyError(
                f"window cron {self.cron!r} is not a 5-field cron expression such as '0 2 * * *'"
            )
        if (
            not isinstance(self.duration_seconds, int)
            or not 60 <= self.duration_seconds <= MAX_DURATION_SECONDS
        ):
            raise PolicyError(
                f"window duration_seconds must be an integer from 60 to {MAX_DURATION_SECONDS}, "
                f"got {self.duration_seconds!r}"
            )
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise PolicyError(
                f"window timezone {self.timezone!r} is not an IANA zone such as 'Europe/Berlin'"
            ) from None

    @classmethod
    def from_dict(cls, data: dict | None) -> MaintenanceWindow | None:
        if not data:
            return None
        if not isinstance(data, dict):
            raise PolicyError("a window must be an object with cron, duration_seconds and timezone")
        unknown = set(data) - {"cron", "duration_seconds", "timezone"}
        if unknown:
            raise PolicyError(f"unknown window field(s): {', '.join(sorted(unknown))}")
        return cls(
            cron=data.get("cron", ""),
            duration_seconds=data.get("duration_seconds", 0),
            timezone=data.get("timezone", "UTC"),
        )

    def as_dict(self) -> dict:
        return {"cron": self.cron, "duration_seconds": self.duration_seconds, "timezone": self.timezone}

    def last_opening(self, now: datetime) -> datetime:
        local = now.astimezone(ZoneInfo(self.timezone))
        # a start exactly at `now` counts: step one second past it before looking back
        return croniter(self.cron, local + timedelta(seconds=1)).get_prev(datetime)

    def is_open(self, now: datetime) -> bool:
        """now must be time-zone aware."""
        return now < self.last_opening(now) + timedelta(seconds=self.duration_seconds)

    def next_opening(self, now: datetime) -> datetime:
        if self.is_open(now):
            return now
        return croniter(self.cron, now.astimezone(ZoneInfo(self.timezone))).get_next(datetime)
