"""The PromQL fleet source: the fleet read from Prometheus (or Thanos, Mimir, VictoriaMetrics)
instead of over SSH. `client.py` speaks the HTTP API, `decode.py` turns series into the model
the SSH source gives, `source.py` is the live source, `history.py` the usage history of
`tenants --window` and `rebalance`. docs/prometheus-source.md.
"""
