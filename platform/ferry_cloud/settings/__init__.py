"""Control-plane settings, read from the environment, one module per concern.

With no variable set, everything is embedded (SQLite, files under var/, a SQLite
Celery broker), which is what `make demo` runs on.  Each concern scales out on the
engine it names: FERRY_DATABASE_URL (PostgreSQL), REDIS_URL (Celery broker),
FERRY_S3_BUCKET (+ FERRY_S3_ENDPOINT_URL) for package and model storage.
"""

from .api import *  # noqa: F403
from .base import *  # noqa: F403
from .broker import *  # noqa: F403
from .cache import *  # noqa: F403
from .database import *  # noqa: F403
from .ferry import *  # noqa: F403
from .logs import *  # noqa: F403
from .observability import *  # noqa: F403
from .security import *  # noqa: F403
from .storage import *  # noqa: F403
from .webhooks import *  # noqa: F403
