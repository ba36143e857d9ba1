"""The local endpoint's page to try a handler by hand, and its OpenAPI document.

``GET /`` (and ``/docs``) serves one self-contained HTML page: inline CSS and script, no
external resource, and a Content-Security-Policy that forbids any (so a page opened on a
machine without network works the same). It sends the request body typed into it to
``/run`` or ``/runsync``, polls ``/stream/{id}`` for the chunks and the status, and shows
the output or the error with its type, category, message, logs and traceback.

``GET /openapi.json`` is built from the app's own route table, so a route added there
appears here; only the words (summaries, schemas) live in this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["PAGE_HEADERS", "PAGE_HTML", "openapi_document"]

_JOB_ID: Final = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_WAIT: Final = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": "How long to hold the request for the result, in ms (default 90000).",
    "schema": {"type": "integer", "minimum": 1000, "maximum": 300000},
}
_RUN_REQUEST: Final = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "input": {"type": "object", "description": "What the handler gets as job['input']."},
        "webhook": {"type": "string", "format": "uri", "description": "POSTed the status."},
        "policy": {
            "type": "object",
            "properties": {
                "executionTimeout": {"type": "integer", "exclusiveMinimum": 5000},
                "ttl": {"type": "integer", "minimum": 10000},
                "lowPriority": {"type": "boolean"},
            },
        },
    },
}
_STATUS: Final = {
    "type": "object",
    "required": ["id", "status"],
    "properties": {
        "id": {"type": "string"},
        "status": {
            "type": "string",
            "enum": ["IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"],
        },
        "delayTime": {"type": "integer", "description": "ms from submission to take"},
        "executionTime": {"type": "integer", "description": "ms from take to the end"},
        "workerId": {"type": "string"},
        "output": {"description": "The handler's result (the last progress update before)."},
        "error": {"description": "A JSON string with error_type, error_category, logs..."},
    },
}
_ERROR: Final = {"type": "object", "properties": {"error": {"type": "string"}}}

# route name -> (summary, extra parameters, request body schema or None, answer schema)
_DESCRIPTIONS: Final[dict[str, tuple[str, list[dict[str, Any]], object, object]]] = {
    "api_run": ("Queue a job; answers at once with its id.", [], _RUN_REQUEST, _STATUS),
    "api_runsync": ("Queue a job and wait for its result.", [_WAIT], _RUN_REQUEST, _STATUS),
    "api_status": ("A job's status, and its output or error once finished.", [], None, _STATUS),
    "api_stream": ("The stream chunks made since the last call.", [], None, {"type": "object"}),
    "api_cancel": ("Cancel a queued or running job.", [], None, _STATUS),
    "api_health": ("Job and worker counts.", [], None, {"type": "object"}),
    "api_purge_queue": ("Cancel every queued job.", [], None, {"type": "object"}),
}


def openapi_document(
    routes: Mapping[str, tuple[str, int]], methods: Mapping[str, frozenset[str]]
) -> dict[str, object]:
    """The OpenAPI 3.1 document of the endpoint API routes in *routes*.

    *routes* maps a first path segment to (route name, number of path arguments), as the
    app's route table does; *methods* gives each route name its methods.
    """
    paths: dict[str, dict[str, object]] = {}
    for segment, (name, arity) in routes.items():
        if name not in _DESCRIPTIONS:
            continue
        summary, parameters, request, answer = _DESCRIPTIONS[name]
        path = f"/{segment}" + ("/{id}" if arity else "")
        operation: dict[str, object] = {
            "operationId": name.removeprefix("api_"),
            "summary": summary,
            "parameters": ([_JOB_ID] if arity else []) + parameters,
            "responses": {
                "200": {"description": "OK", "content": _json(answer)},
                "400": {"description": "Refused, nothing queued", "content": _json(_ERROR)},
                "404": {"description": "No such job (or forgotten)", "content": _json(_ERROR)},
            },
        }
        if request is not None:
            operation["requestBody"] = {"required": True, "content": _json(request)}
            operation["responses"]["413"] = {  # type: ignore[index]
                "description": "Body too large",
                "content": _json(_ERROR),
            }
        paths[path] = {method.lower(): operation for method in sorted(methods[name])}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "trio_worker local endpoint",
            "version": "1",
            "description": "Runpod's endpoint API, served on localhost by the worker.",
        },
        "paths": paths,
    }


def _json(schema: object) -> dict[str, object]:
    return {"application/json": {"schema": schema}}


_CSS: Final = """
body{font:15px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1c2330}
header{background:#1c2330;color:#fff;padding:.7em 1.2em}header h1{font-size:1.1em;margin:0}
main{display:grid;grid-template-columns:minmax(18em,1fr) minmax(18em,1.3fr);gap:1em;padding:1em}
section{background:#fff;border:1px solid #d8dce3;border-radius:6px;padding:.8em 1em}
h2{font-size:.95em;margin:.1em 0 .6em;text-transform:uppercase;color:#566}
textarea{width:100%;box-sizing:border-box;height:14em;font:13px ui-monospace,monospace}
button{font:inherit;padding:.35em .9em;margin:.5em .4em 0 0;cursor:pointer}
pre{background:#f3f4f6;padding:.5em;margin:.3em 0;white-space:pre-wrap;word-break:break-word;
max-height:16em;overflow:auto;font:12.5px ui-monospace,monospace}
.badge{display:inline-block;padding:.1em .6em;border-radius:1em;background:#ccd;font-weight:600}
.COMPLETED{background:#bfe6c4}.FAILED,.TIMED_OUT,.REFUSED{background:#f5c2c0}
.IN_PROGRESS,.IN_QUEUE,.SENDING{background:#fde9b0}
ol{margin:.2em 0;padding-left:2em;font:12.5px ui-monospace,monospace;max-height:12em;overflow:auto}
dl{display:grid;grid-template-columns:auto 1fr;gap:.2em .8em;margin:.3em 0}dt{color:#566}
dd{margin:0}.muted{color:#778}[hidden]{display:none}
"""

_SCRIPT: Final = """
const $ = (id) => document.getElementById(id);
const TERMINAL = ["COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"];
let job = null, token = 0;

function setStatus(status) {
  const badge = $("status");
  badge.textContent = status;
  badge.className = "badge " + status;
}
function reset() {
  token += 1; job = null;
  for (const id of ["job-id", "times", "output", "problem", "raw"]) $(id).textContent = "";
  $("chunks").replaceChildren();
  $("chunk-count").textContent = "0";
  $("error").hidden = true; $("result").hidden = true; $("problem").hidden = true;
  setStatus("-");
}
function problem(text) { $("problem").textContent = text; $("problem").hidden = false; }
function pretty(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}
function addChunks(stream) {
  for (const item of stream || []) {
    const li = document.createElement("li");
    li.textContent = pretty(item.output);
    $("chunks").append(li);
  }
  $("chunk-count").textContent = String($("chunks").children.length);
}
function showError(error) {
  let fields = null;
  if (typeof error === "string") {
    try { fields = JSON.parse(error); } catch (e) { fields = null; }
  } else if (error && typeof error === "object") { fields = error; }
  if (!fields || typeof fields !== "object" || Array.isArray(fields)) {
    fields = {error_message: pretty(error)};
  }
  $("error-type").textContent = fields.error_type || "";
  $("error-category").textContent = fields.error_category || "";
  $("error-message").textContent = fields.error_message || "";
  $("error-logs").textContent = fields.logs || "";
  $("error-traceback").textContent = fields.error_traceback || "";
  $("error").hidden = false;
}
function show(answer) {
  setStatus(answer.status);
  $("raw").textContent = JSON.stringify(answer, null, 2);
  const times = [];
  if (answer.delayTime !== undefined) times.push("delay " + answer.delayTime + " ms");
  if (answer.executionTime !== undefined) times.push("execution " + answer.executionTime + " ms");
  if (answer.workerId) times.push("worker " + answer.workerId);
  $("times").textContent = times.join(" · ");
  if ("output" in answer) {
    $("output").textContent = pretty(answer.output);
    $("result").hidden = false;
  }
  if (answer.status === "FAILED") showError(answer.error);
}
async function call(method, path, body) {
  const options = {method, headers: {"Content-Type": "application/json"}};
  if (body !== undefined) options.body = body;
  const response = await fetch(path, options);
  let answer;
  try { answer = await response.json(); } catch (e) { answer = {error: response.statusText}; }
  if (!response.ok) throw new Error(response.status + ": " + (answer.error || "error"));
  return answer;
}
async function follow(mine) {
  while (mine === token && job) {
    const part = await call("GET", "/stream/" + encodeURIComponent(job));
    if (mine !== token) return;
    addChunks(part.stream);
    setStatus(part.status);
    if (TERMINAL.includes(part.status)) {
      show(await call("GET", "/status/" + encodeURIComponent(job)));
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}
async function send(path) {
  reset();
  const mine = token;
  const text = $("body").value;
  try { JSON.parse(text); } catch (e) {
    setStatus("REFUSED"); problem("The request is not valid JSON: " + e.message); return;
  }
  setStatus("SENDING");
  try {
    const answer = await call("POST", path, text);
    if (mine !== token) return;
    job = answer.id;
    $("job-id").textContent = job;
    show(answer);
    await follow(mine);
  } catch (e) {
    if (mine !== token) return;
    if (!job) setStatus("REFUSED");
    problem(e.message);
  }
}
$("run").addEventListener("click", () => send("/run"));
$("runsync").addEventListener("click", () => send("/runsync"));
$("cancel").addEventListener("click", async () => {
  if (!job) return;
  try { show(await call("POST", "/cancel/" + encodeURIComponent(job))); }
  catch (e) { problem(e.message); }
});
"""

_BODY: Final = """
<header><h1>trio_worker local endpoint</h1></header>
<main>
<section>
<h2>Request</h2>
<label for="body" class="muted">The request body: <code>input</code> is what your handler
gets; <code>webhook</code> and <code>policy</code> work as on Runpod.</label>
<textarea id="body" spellcheck="false">{"input": {"prompt": "hello"}}</textarea>
<div><button id="run">POST /run</button><button id="runsync">POST /runsync</button>
<button id="cancel">Cancel</button></div>
<p class="muted">Also: <a href="/openapi.json">/openapi.json</a>, <a href="/health">/health</a>
</p>
</section>
<section>
<h2>Job</h2>
<dl><dt>id</dt><dd id="job-id"></dd><dt>status</dt><dd><span id="status" class="badge">-</span>
</dd><dt>timing</dt><dd id="times"></dd></dl>
<pre id="problem" hidden></pre>
<h2>Stream chunks (<span id="chunk-count">0</span>)</h2>
<ol id="chunks"></ol>
<div id="result" hidden><h2>Output</h2><pre id="output"></pre></div>
<div id="error" hidden><h2>Error</h2>
<dl><dt>type</dt><dd id="error-type"></dd><dt>category</dt><dd id="error-category"></dd>
<dt>message</dt><dd id="error-message"></dd></dl>
<h2>Logs</h2><pre id="error-logs"></pre>
<h2>Traceback</h2><pre id="error-traceback"></pre></div>
<details><summary class="muted">Full status object</summary><pre id="raw"></pre></details>
</section>
</main>
"""

#: default-src 'none': the page may load nothing at all; it only calls its own origin.
_CSP: Final = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'"
)

#: Response headers of the page: no other page may frame it (a click on a framed page is
#: the page's click; browsers ignore ``frame-ancestors`` in a ``<meta>`` policy).
PAGE_HEADERS: Final = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
)

PAGE_HTML: Final = (
    '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
    f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
    '<meta name="viewport" content="width=device-width,initial-scale=1">'
    f"<title>trio_worker local endpoint</title><style>{_CSS}</style></head>"
    f"<body>{_BODY}<script>{_SCRIPT}</script></body></html>\n"
).encode()
