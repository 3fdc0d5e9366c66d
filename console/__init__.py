"""The operator console (ADR 0037): server-rendered pages over ``deniable.admin``.

``server.ConsoleConfig`` and ``server.run_console`` start it (``deniable console``); ``app.build_app``
is the aiohttp application (tests drive it with a fake ``backend.Backend``); ``pages`` renders HTML
with ``html.escape``, ``svg`` draws the charts server-side (no network, no CDN); ``auth`` holds the
slow token hash, the CSRF tokens and the refusal to listen beyond loopback without TLS and a login.
"""
