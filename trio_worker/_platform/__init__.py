"""The client side of the worker protocol (docs/protocol.md).

* ``_client``: `PlatformClient`, the routes (take, stop, done, stream), each one attempt,
  and the one ``Retry-After`` parser (the retries are ``_delivery``'s, the waits ``_pacing``'s).
* ``_wire``: parsing take and stop answers into jobs, malformed items and warnings.
* ``_http``: picks the client: the lean one, or, with proxy variables set, ``_routes``,
  which sends each origin direct (lean) or through its proxy (``_proxy``, httpx).
* ``_lean``, ``_connection``, ``_reading``, ``_request``, ``_answer``: the lean HTTP/1.1
  client every route runs on (one request path, one parser, one reuse rule).
* ``_heartbeat``: the ping thread, on its own trio loop and connection (and the same pings
  as a trio task, for virtual time).

Nothing here imports the supervisor or the job runner: data flows from the supervisor
down into this package, never back.
"""
