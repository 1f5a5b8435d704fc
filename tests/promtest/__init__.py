"""Real-Prometheus test infrastructure: Debian's ``prometheus`` on loopback, and its ``promtool``.

``prometheus`` starts a server with the test's scrape targets and rules and queries it over its
HTTP API; ``promtool`` lints expositions and checks and unit-tests rule files; ``exposition``
serves a test's own exposition as a scrape target; ``dashboards`` reads the Grafana dashboards'
queries and the metric names in PromQL; ``fixtures`` has the pytest fixtures (import them
explicitly in a test module). See docs/testing.md.
"""
