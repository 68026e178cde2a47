#!/usr/bin/env python
"""Django's command-line utility for Ferry's control plane (apps live in platform/)."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
