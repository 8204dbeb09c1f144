"""A fake Kubernetes API server for pods: enough of list and watch for shaperd's client.

It speaks HTTP/1.1 on 127.0.0.1 (random port, no auth) like the real server:
``GET /api/v1/pods`` with ``fieldSelector=spec.nodeName=...`` returns a
PodList carrying metadata.resourceVersion; with ``watch=1`` it streams chunked
newline-delimited watch events after ``resourceVersion`` until
``timeoutSeconds`` and answers a version older than its compaction point with
an ERROR event holding a 410 Status (or, in ``gone_as_http`` mode, an HTTP
410). Every change bumps one global resourceVersion, including changes to
pods on other nodes, so bookmarks carry versions no pod event had.

Test hooks: add/modify/delete pods, unrelated writes, bookmarks, compaction,
drop every watch, hang (stop answering), inject garbage lines or raw events,
go down and come back on the same port, demand a bearer token (``token``: a request
without it gets a 401). Faults (issue 14): ``delay_s``
(every answer that late), ``fail_status`` (every request answered with that
HTTP status, e.g. 500), ``gone_loop`` (every watch answered 410, so every
relist is followed by another 410), ``truncate_watches`` (every watch sends
half an event line and is cut). ``requests`` logs what every client
asked for, each with its ``access``: the (verb, API group, resource,
namespace, name) the real API server's authorizer would check it as
(``request_access``, after k8s.io/apiserver's RequestInfoFactory), so RBAC
can be checked against what a client really asked (tests/rbac.py). Writes
(POST, PUT, PATCH, DELETE) are recorded too and refused with 405: the fake
serves reads only, with one exception: Node objects (``add_node``) are served at
/api/v1/nodes/NAME for GET and for a JSON patch (RFC 6902, applied by the ``jsonpatch``
package; a failed ``test`` op answers 422, as the real server does), which is the startup
taint's write; ``before_node_patch`` lets a test edit the node between a client's read and
its patch. ``write_kubeconfig`` points a client at it.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, urlsplit


class Access(NamedTuple):
    """What RBAC authorises a request as (a resource request; ``path`` set instead for a non-resource URL)."""

    verb: str
    group: str = ""  # "" is the core group (/api/v1)
    resource: str = ""  # with "/subresource" when there is one, as RBAC rules name it
    namespace: str = ""  # "" for cluster-scoped and all-namespaces requests
    name: str = ""
    path: str = ""  # a non-resource URL (/version, /apis): RBAC's nonResourceURLs


_WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def request_access(method: str, path: str, query: dict[str, str]) -> Access:
    """The authorizer's view of one request, as k8s.io/apiserver/pkg/endpoints/request/requestinfo.go derives it:
    /api/v1/... is the core group and /apis/GROUP/VERSION/... a named one; namespaces/NS/ scopes a request;
    a GET of a collection is list (watch with watch=true, or under the legacy /watch/ prefix), of a named
    object get; a list or watch with fieldSelector=metadata.name=X is authorised against resourceNames [X]."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return Access(verb=method.lower(), path=path)  # discovery, /version, /healthz: non-resource URLs
    if not rest:
        return Access(verb=method.lower(), path=path)  # /api/v1, /apis/GROUP/VERSION: discovery
    legacy_watch = rest[0] == "watch"
    if legacy_watch:
        rest = rest[1:]
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        namespace, rest = rest[1], rest[2:]
    elif len(rest) == 2 and rest[0] == "namespaces":
        namespace = rest[1]  # GET /api/v1/namespaces/NS is the namespace object itself
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        watching = legacy_watch or query.get("watch") in ("1", "true", "True")
        verb = "watch" if watching else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _WRITE_VERBS.get(method, method.lower())
    sel = query.get("fieldSelector", "")
    if verb in ("list", "watch") and sel.startswith("metadata.name=") and "," not in sel:
        name = sel.split("=", 1)[1]
    return Access(verb, group, resource, namespace, name)


def make_pod(name: str, node: str, namespace: str = "default", ips=("10.0.0.1",), labels=None,
             qos: str | None = "BestEffort", phase: str = "Running", host_network: bool = False,
             uid: str | None = None) -> dict:
    ips = list(ips)
    status: dict = {"phase": phase}
    if qos:
        status["qosClass"] = qos
    if ips:
        status["podIP"] = ips[0]
        status["podIPs"] = [{"ip": ip} for ip in ips]
    spec: dict = {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    if host_network:
        spec["hostNetwork"] = True
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                     "labels": dict(labels or {}), "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": spec, "status": status,
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, fake: "FakeKubeAPI", addr):
        self.fake = fake
        super().__init__(addr, _Handler)

    def process_request(self, request, client_address):
        with self.fake._cond:
            self.fake._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.fake._cond:
            self.fake._conns.discard(request)
        super().shutdown_request(request)


class FakeKubeAPI:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._cond = threading.Condition()
        self._conns: set[socket.socket] = set()
        self.pods: dict[str, dict] = {}  # uid -> pod
        self.rv = 1000
        self.events: list[tuple[int, str, dict | None, str | None]] = []  # (rv, type, object, raw line)
        self.compacted_rv = 0
        self.gone_as_http = False
        self.hanging = False
        self.drop_gen = 0
        self.up_gen = 0
        self.requests: list[dict] = []
        # When set, every request must carry "Authorization: Bearer <token>" or gets a 401 Status.
        self.token: str | None = None
        # Other collections (ConfigMaps, CRDs such as Volcano's): path -> key -> object; an unregistered
        # path answers 404, like an API group that is not installed.
        self.objects: dict[str, dict[str, dict]] = {}
        self.obj_events: list[tuple[int, str, str, dict]] = []  # (rv, collection path, type, object)
        self.nodes: dict[str, dict] = {}  # name -> Node (add_node); GET and JSON PATCH only
        self.before_node_patch = None  # fn(fake, name): called before a node PATCH is applied
        self.delay_s = 0.0
        self.fail_status: int | None = None
        self.gone_loop = False
        self.truncate_watches = False
        self.host = host
        self._server = _Server(self, (host, port))
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None
        self.running = False
        self.start()

    # ---- lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Serve (the constructor already does; after go_down, come_back does)."""
        if self.running:
            return  # a second serve_forever thread on one server would make shutdown() wait on the wrong one
        if self._server is None:
            self._server = _Server(self, (self.host, self.port))
        self.running = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-kube-api", daemon=True)
        self._thread.start()

    def go_down(self) -> None:
        """Refuse connections and cut every open one (an API server restart)."""
        with self._cond:
            self.running = False
            self.up_gen += 1
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        self._cut_all()

    def come_back(self) -> None:
        self.start()

    def close(self) -> None:
        if self._server is not None:
            self.go_down()

    def _cut_all(self) -> None:
        with self._cond:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---- state changes (each bumps the global resourceVersion)

    def _emit(self, etype: str, obj: dict | None, raw: str | None = None) -> int:
        with self._cond:
            self.rv += 1
            if obj is not None:
                obj = copy.deepcopy(obj)
                if isinstance(obj.get("metadata"), dict):
                    obj["metadata"]["resourceVersion"] = str(self.rv)
            self.events.append((self.rv, etype, obj, raw))
            self._cond.notify_all()
            return self.rv

    def add_pod(self, pod: dict) -> dict:
        with self._cond:
            self._emit("ADDED", pod)
            self.pods[pod["metadata"]["uid"]] = self.events[-1][2]
            return self.pods[pod["metadata"]["uid"]]

    def modify_pod(self, uid: str, fn) -> dict:
        with self._cond:
            pod = copy.deepcopy(self.pods[uid])
            fn(pod)
            self._emit("MODIFIED", pod)
            self.pods[uid] = self.events[-1][2]
            return self.pods[uid]

    def set_labels(self, uid: str, labels: dict) -> dict:
        return self.modify_pod(uid, lambda p: p["metadata"].__setitem__("labels", dict(labels)))

    def delete_pod(self, uid: str) -> int:
        """Returns the version of the DELETED event."""
        with self._cond:
            pod = self.pods.pop(uid)
            return self._emit("DELETED", pod)

    def unrelated_writes(self, n: int = 1) -> int:
        """Writes elsewhere in the cluster: the version moves, our watchers see nothing."""
        with self._cond:
            self.rv += n
            return self.rv

    def bookmark(self) -> int:
        """A BOOKMARK at the current version, to watchers that asked for bookmarks."""
        with self._cond:
            rv = self.rv
            self.events.append((rv, "BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                                 "metadata": {"resourceVersion": str(rv)}}, None))
            self._cond.notify_all()
            return rv

    def raw_event(self, etype: str, obj) -> int:
        """An event whose object is whatever the test says (malformed pods); it gets a version."""
        return self._emit(etype, obj) if isinstance(obj, dict) else self._emit(etype, None, json.dumps(
            {"type": etype, "object": obj}))

    def garbage(self, line: str = "this is not json {", persistent: bool = False) -> None:
        """A line sent once to the watches open now; ``persistent``: kept in history at a
        new version, so every watch resuming from before it gets it again (a poison event)."""
        with self._cond:
            if persistent:
                self.rv += 1
            self.events.append((self.rv if persistent else -1, "GARBAGE", None, line))
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget history: watches from older versions get 410 Gone (pods and the other collections)."""
        with self._cond:
            self.compacted_rv = self.rv
            self.events = [e for e in self.events if e[0] > self.rv]
            self.obj_events = [e for e in self.obj_events if e[0] > self.rv]

    def drop_watches(self) -> None:
        with self._cond:
            self.drop_gen += 1
            self._cond.notify_all()
        self._cut_all()

    def hang(self, on: bool = True) -> None:
        """Stop answering: new requests wait with no reply, open watches go silent."""
        with self._cond:
            self.hanging = on
            self._cond.notify_all()

    # ---- nodes (the startup taint's GET and JSON patch)

    def add_node(self, name: str, taints: list[dict] | None = None) -> dict:
        with self._cond:
            self.rv += 1
            node = {"kind": "Node", "apiVersion": "v1",
                    "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": str(self.rv),
                                 "labels": {"kubernetes.io/hostname": name}},
                    "spec": {"taints": copy.deepcopy(taints)} if taints is not None else {}}
            self.nodes[name] = node
            return copy.deepcopy(node)

    def edit_node(self, name: str, fn) -> dict:
        """Change a node as another client would (``fn(node)`` in place); bumps its resourceVersion."""
        with self._cond:
            node = copy.deepcopy(self.nodes[name])
            fn(node)
            self.rv += 1
            node["metadata"]["resourceVersion"] = str(self.rv)
            self.nodes[name] = node
            return copy.deepcopy(node)

    def node_taints(self, name: str) -> list[dict]:
        with self._cond:
            return copy.deepcopy(self.nodes[name].get("spec", {}).get("taints", []))

    def node_patches(self) -> list[dict]:
        """The PATCH requests to nodes, with their bodies, in order."""
        with self._cond:
            return [r for r in self.requests if r["method"] == "PATCH" and r["path"].startswith("/api/v1/nodes/")]

    # ---- other collections

    def collection(self, path: str) -> None:
        """Serve ``path`` (e.g. /apis/scheduling.volcano.sh/v1beta1/podgroups): list and watch."""
        with self._cond:
            self.objects.setdefault(path, {})

    def put_object(self, path: str, obj: dict) -> dict:
        """Create or replace an object in a collection (ADDED or MODIFIED); a namespaced collection path
        (/api/v1/namespaces/NS/configmaps) and the all-namespaces path both see it."""
        with self._cond:
            meta = obj["metadata"]
            key = f"{meta.get('namespace')}/{meta['name']}" if meta.get("namespace") else meta["name"]
            coll = self.objects.setdefault(path, {})
            etype = "MODIFIED" if key in coll else "ADDED"
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            coll[key] = obj
            self.obj_events.append((self.rv, path, etype, obj))
            self._cond.notify_all()
            return obj

    def delete_object(self, path: str, key: str) -> None:
        with self._cond:
            obj = self.objects[path].pop(key)
            self.rv += 1
            self.obj_events.append((self.rv, path, "DELETED", obj))
            self._cond.notify_all()

    def _serve_objects(self, handler: "_Handler", path: str, q: dict, watch: bool) -> None:
        sel = q.get("fieldSelector", "")
        name = sel.split("=", 1)[1] if sel.startswith("metadata.name=") else None

        def chosen(obj: dict) -> bool:
            return name is None or obj["metadata"]["name"] == name

        if not watch:
            with self._cond:
                items = [o for o in self.objects[path].values() if chosen(o)]
                body = {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)},
                        "items": items}
            return handler._json(200, body)
        since = int(q.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 1800)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        if since and since < self.compacted_rv:  # history forgotten (compact): 410 Gone, as for pods
            handler._chunk(json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired",
                "code": 410, "message": f"too old resource version: {since} ({self.compacted_rv})"}}))
            handler.wfile.write(b"0\r\n\r\n")
            return
        with self._cond:
            drop_gen, up_gen = self.drop_gen, self.up_gen
        try:
            while True:
                with self._cond:
                    while True:
                        if self.drop_gen != drop_gen or self.up_gen != up_gen or not self.running:
                            handler.close_connection = True
                            return
                        pending = [e for e in self.obj_events if e[0] > since and e[1] == path and chosen(e[3])]
                        if pending or time.monotonic() >= deadline:
                            break
                        self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                if not pending:
                    break
                for rv, _, etype, obj in pending:
                    handler._chunk(json.dumps({"type": etype, "object": obj}))
                    since = rv
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            handler.close_connection = True

    # ---- queries for assertions

    def watch_requests(self) -> list[dict]:
        return [r for r in self.requests if r.get("watch")]

    def list_requests(self) -> list[dict]:
        return [r for r in self.requests if not r.get("watch")]

    def accesses(self) -> list[Access]:
        """Every request so far, as RBAC sees it (request_access), in order."""
        with self._cond:
            return [r["access"] for r in self.requests]


def _selected(pod: dict | None, node: str | None) -> bool:
    if pod is None or node is None:
        return True
    spec = pod.get("spec") if isinstance(pod, dict) else None
    return not isinstance(spec, dict) or spec.get("nodeName") in (node, None)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def _record(self) -> tuple[FakeKubeAPI, object, dict, bool]:
        fake = self.server.fake
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        watch = q.get("watch") in ("1", "true", "True")
        with fake._cond:
            fake.requests.append({"method": self.command, "path": url.path, "query": q, "watch": watch,
                                  "resourceVersion": q.get("resourceVersion"), "time": time.monotonic(),
                                  "authorization": self.headers.get("Authorization"),
                                  "access": request_access(self.command, url.path, q)})
        return fake, url, q, watch

    def _refuse_write(self) -> None:
        """Recorded (an agent that writes shows in ``requests``), then refused: the fake serves reads only."""
        self._record()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._json(405, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 405,
                         "reason": "MethodNotAllowed", "message": f"{self.command} is not served by the fake"})

    do_POST = do_PUT = do_DELETE = _refuse_write

    def do_PATCH(self) -> None:
        """A JSON patch of a Node (the startup taint); any other PATCH is refused like every write."""
        url = urlsplit(self.path)
        fake = self.server.fake
        name = url.path.removeprefix("/api/v1/nodes/")
        if not url.path.startswith("/api/v1/nodes/") or "/" in name or name not in fake.nodes:
            return self._refuse_write()
        fake, url, q, _ = self._record()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with fake._cond:
            fake.requests[-1]["body"] = body
        if not self._gate(fake):
            return
        if self.headers.get("Content-Type") != "application/json-patch+json":
            return self._json(415, {"kind": "Status", "code": 415, "reason": "UnsupportedMediaType",
                                    "message": f"the fake takes JSON patches only, not {self.headers.get('Content-Type')}"})
        if fake.before_node_patch is not None:
            fake.before_node_patch(fake, name)
        import jsonpatch

        with fake._cond:
            try:
                ops = json.loads(body)
                new = jsonpatch.apply_patch(fake.nodes[name], ops)
            except jsonpatch.JsonPatchTestFailed as e:  # k8s.io/apiserver: 422 when a patch cannot be applied
                return self._json(422, {"kind": "Status", "code": 422, "reason": "Invalid",
                                        "message": f"the server rejected our request due to an error in our request: {e}"})
            except (ValueError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                return self._json(400, {"kind": "Status", "code": 400, "reason": "BadRequest", "message": str(e)})
            fake.rv += 1
            new["metadata"]["resourceVersion"] = str(fake.rv)
            fake.nodes[name] = new
            out = copy.deepcopy(new)
        self._json(200, out)

    def _gate(self, fake: "FakeKubeAPI") -> bool:
        """Hang, go down, delay, injected status and the bearer token, for a request that is not a watch;
        False when it was answered (or cut) here."""
        with fake._cond:
            gen = fake.up_gen
            while fake.hanging and fake.running and fake.up_gen == gen:
                fake._cond.wait(0.1)
            until = time.monotonic() + fake.delay_s
            while fake.running and fake.up_gen == gen and time.monotonic() < until:
                fake._cond.wait(min(0.1, until - time.monotonic()))
            if not fake.running or fake.up_gen != gen:
                self.close_connection = True
                return False
            fail, token = fake.fail_status, fake.token
        if fail is not None:
            self._json(fail, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": fail,
                              "reason": "InternalError", "message": "injected fault"})
            return False
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            self._json(401, {"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        name = url.path.removeprefix("/api/v1/nodes/")
        if url.path.startswith("/api/v1/nodes/") and "/" not in name:
            fake, url, q, _ = self._record()
            if not self._gate(fake):
                return
            with fake._cond:
                node = copy.deepcopy(fake.nodes.get(name))
            if node is None:
                return self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound",
                                        "message": f'nodes "{name}" not found'})
            return self._json(200, node)
        fake, url, q, watch = self._record()
        sel = q.get("fieldSelector", "")
        with fake._cond:
            token = fake.token
            gen = fake.up_gen
            while fake.hanging and fake.running and fake.up_gen == gen:
                fake._cond.wait(0.1)
            if not fake.running or fake.up_gen != gen:
                self.close_connection = True
                return
            # A slow server: the answer comes delay_s late (a go_down in between still cuts it).
            until = time.monotonic() + fake.delay_s
            while fake.running and fake.up_gen == gen and time.monotonic() < until:
                fake._cond.wait(min(0.1, until - time.monotonic()))
            if not fake.running or fake.up_gen != gen:
                self.close_connection = True
                return
            fail = fake.fail_status
        if fail is not None:
            return self._json(fail, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": fail,
                                     "reason": "InternalError", "message": "injected fault"})
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            return self._json(401, {"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "Unauthorized"})
        if url.path in fake.objects:
            return fake._serve_objects(self, url.path, q, watch)
        if url.path != "/api/v1/pods":
            return self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": "not here"})
        node = None
        if sel:
            if not sel.startswith("spec.nodeName="):
                return self._json(400, {"kind": "Status", "code": 400, "reason": "BadRequest",
                                        "message": f"unsupported field selector {sel}"})
            node = sel.split("=", 1)[1]
        if watch:
            return self._watch(fake, node, q)
        with fake._cond:
            items = [p for p in fake.pods.values() if _selected(p, node)]
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(fake.rv)},
                    "items": items}
        self._json(200, body)

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, line: str) -> None:
        data = (line + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, fake: FakeKubeAPI, node: str | None, q: dict) -> None:
        try:
            since = int(q.get("resourceVersion") or 0)
        except ValueError:
            since = 0
        timeout = float(q.get("timeoutSeconds") or 1800)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1", "True")
        gone = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": f"too old resource version: {since} ({fake.compacted_rv})", "reason": "Expired", "code": 410}
        if fake.gone_loop:
            gone["message"] = f"too old resource version: {since} ({fake.rv + 1})"  # always newer than the list
            since = -1
        if since and since < fake.compacted_rv and fake.gone_as_http:
            return self._json(410, gone)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if fake.truncate_watches:
            half = json.dumps({"type": "ADDED", "object": make_pod("half", node or "n")})
            self.wfile.write(b"%x\r\n%s\r\n" % (len(half) // 2, half[: len(half) // 2].encode()))
            self.wfile.flush()
            self.close_connection = True
            return  # cut mid-event, without the final chunk
        if since == -1 or (since and since < fake.compacted_rv):
            self._chunk(json.dumps({"type": "ERROR", "object": gone}))
            self.wfile.write(b"0\r\n\r\n")
            return
        deadline = time.monotonic() + timeout
        with fake._cond:
            drop_gen, up_gen = fake.drop_gen, fake.up_gen
            # history after `since`, then live events (garbage only live)
            pos = next((i for i, e in enumerate(fake.events) if e[0] > since), len(fake.events))
            pos = max(pos, 0)
            history_end = len(fake.events)
        try:
            while True:
                with fake._cond:
                    while True:
                        if fake.drop_gen != drop_gen or fake.up_gen != up_gen or not fake.running:
                            self.close_connection = True
                            return  # cut without the final chunk: the client sees a broken stream
                        if time.monotonic() >= deadline:
                            break
                        if not fake.hanging and pos < len(fake.events):
                            break
                        fake._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                    if time.monotonic() >= deadline and (fake.hanging or pos >= len(fake.events)):
                        if fake.hanging:
                            self.close_connection = True
                            return
                        break
                    rv, etype, obj, raw = fake.events[pos]
                    pos += 1
                if etype == "GARBAGE":
                    if rv > since or pos - 1 >= history_end:
                        self._chunk(raw)
                    continue
                if etype == "BOOKMARK":
                    if bookmarks and rv > since:
                        self._chunk(json.dumps({"type": "BOOKMARK", "object": obj}))
                    continue
                if rv <= since or not _selected(obj, node):
                    continue
                self._chunk(raw if raw is not None else json.dumps({"type": etype, "object": obj}))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True


def write_kubeconfig(path: str | Path, server_url: str) -> Path:
    """A kubeconfig for the fake: plain http, no credentials, one context."""
    path = Path(path)
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {server_url}\n"
        "users:\n- name: nobody\n  user: {}\n"
        "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n"
        "current-context: fake\n"
    )
    return path
