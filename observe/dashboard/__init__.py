"""The coordinator's HTTP dashboard: `server` (HTTP, routing, the cached Dashboard), `views` (the
dicts of the JSON API and page), `render` (HTML and PNG plots), `prometheus` (the /metrics collector), `auth` (tokens,
sessions, the login throttle), `proxies` (the client of a request through a trusted reverse proxy)."""

from rcswarm.observe.dashboard.server import Dashboard, is_loopback

__all__ = ["Dashboard", "is_loopback"]
