"""The service skeleton both parties' HTTP services are built on: one error envelope whose codes carry their
HTTP status (:mod:`.errors`), API keys (:mod:`.keys`), a gatekeeper that authenticates and authorizes before any
body is read and limits bodies per endpoint (:mod:`.gate`), columnar downloads with content negotiation
(:mod:`.tables`), the OpenAPI declarations that go with them (:mod:`.openapi`), and the application that puts
them together for a party (:mod:`.app`)."""
