"""The client side of the worker protocol (docs/protocol.md).

* ``_client``: `PlatformClient`, the routes (take, stop, done, stream) and their URLs, each
  one attempt (the retries are ``_delivery``'s, the waits ``_pacing``'s), and a take's
  answer read into jobs: everything a job's path needs beside the pool.
* ``_wire``: the answers off a job's path: stop, ``Retry-After``, a take answer that does
  not decode or is too large.
* ``_http``: `HttpPool`, the one HTTP/1.1 client every route runs on, and its reuse rule
  (the quiet check); or, with proxy variables set, ``_proxy``'s `ProxyRoutes`, which sends
  each origin direct (the pool) or through its proxy (httpx).
* ``_connection``: one kept-alive connection and the one answer parser (llhttp).
* ``_request``: origins, targets and headers, checked once, and the client's errors;
  ``_network``: the socket stream under each connection, and TLS.
* ``_heartbeat``: the ping thread, on its own trio loop and connection (and the same pings
  as a trio task, for virtual time).

Nothing here imports the supervisor or the job runner: data flows from the supervisor
down into this package, never back.
"""
