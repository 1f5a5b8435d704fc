"""`gpuops tui`: the live fleet view (Textual). See docs/tui.md.

- `feed.py`: the data layer (sources, the Feed, immutable FleetState);
- `app.py`: the application (views as modes, global keys, command and filter bars);
- `screens/`: one module per screen; `grid.py`, `widgets.py`: what they draw with;
- `keys.py`: every key, once (bindings and help come from it);
- `render.py`: colours and short texts.

What the screens show (tenants, waste, grid groups, filters, sorting, number formats) is computed
in the view models, `gpuops.views`; who owns what in `gpuops.tenancy.ownership`;
simulated nodes in-process (tests, benchmarks) in `gpuops.fleet.simsource`.
"""
