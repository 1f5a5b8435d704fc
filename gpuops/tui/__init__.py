"""`gpuops tui`: the live fleet view (Textual). See docs/tui.md.

- `app.py`: the application (views as modes, global keys, command and filter bars);
- `screens/`: one module per screen; `grid.py`, `widgets.py`: what they draw with;
- `keys.py`: every key, once (bindings and help come from it);
- `render.py`: colours and short texts.

The screens draw view models only (import-linter's `tui` contract): the immutable `FleetState`s
of the feed (`gpuops.views.feed`), built from any fleet source (`gpuops.fleet.source`), and what
the screens show (tenants, waste, grid groups, filters, sorting, number formats), computed in
`gpuops.views`.
"""
