"""Operations: Prometheus metrics, health and readiness checks, structured logs with request ids.

Modules are small and import Django lazily where they can, so the settings can configure
logging before any app is loaded, and the gateway and the Celery worker share the same code.
"""
