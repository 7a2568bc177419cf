"""The owner's console: a web console of the labels-party service for the privacy officer of a dataset owner
(admin keys only), mounted at ``/console`` by :func:`labels_party.http.api.create_app`.

Server-rendered HTML (Jinja2) with charts as inline SVG drawn on the server; no script, nothing fetched from
elsewhere. Modules: :mod:`~labels_party.http.console.app` (the mounted application and its HTML error pages),
:mod:`~labels_party.http.console.gate` (security headers, body limit, origin check and session authentication before
any body is read), :mod:`~labels_party.http.console.sessions` (sign-in with an API key, hashed session tokens, CSRF
tokens), :mod:`~labels_party.http.console.routes` (pages and forms), :mod:`~labels_party.http.console.views` (what a
page shows, through the service's functions), :mod:`~labels_party.http.console.charts` (SVG) and
:mod:`~labels_party.http.console.randomizer` (a release's randomizer as a bounded matrix)."""
