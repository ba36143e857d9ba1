"""The client side of the worker protocol (docs/protocol.md).

* ``_client``: `PlatformClient`, the routes (take, stop, done, stream) and report retries.
* ``_wire``: parsing take and stop answers into jobs, malformed items and warnings.
* ``_http``: the HTTP/1.1 client the routes run on, and the httpx adapter for proxies.
* ``_heartbeat``: the ping thread (and the same pings as a trio task, for virtual time).

Nothing here imports the supervisor or the job runner: data flows from the supervisor
down into this package, never back.
"""
