"""An external materialization driver speaking Flow's CURRENT protocol
(`materialize.Connector/Materialize`: one stream of `Request` and `Response`), written
in Python against `crates/proto/proto/current/*.proto` as a connector author would:
authoritative, fenced, its store a JSON file.

One stream, as the driver sees it:

    Spec | Validate | Apply ...            (each answered; any number, any order)
    Open ─────────────▶ Opened             (fences the range; the stored checkpoint)
    ┌ Acknowledge ────▶ Acknowledged       (late: answered; early: sent already, below)
    │ Load* ──────────▶ Loaded*            (answered at once from committed rows)
    │ Flush ──────────▶ Flushed            (state patch: flushes)
    │ Store*                               (staged)
    └ StartCommit ────▶ StartedCommit      (rows + runtime checkpoint committed together,
                        [Acknowledged]      fence checked; state patch: commits; early:
                                            Acknowledged right after, before Acknowledge)

- The store (`--state FILE`, JSON) holds each materialization's tables, the runtime
  checkpoint (a serialized `consumer.Checkpoint`) of each committed key range, the fence
  token of every Open and a commit count. Every Open and commit reads and writes it
  under an exclusive file lock, so separate processes (over stdio: one per stream)
  share it; Loads read the last committed version.
- Every Open takes a fence token for its key range; a commit fails ("fenced off") once a
  newer Open overlaps the range. Opened returns the checkpoint of the narrowest committed
  range covering the opened one.
- A commit checks the fence, then each Store's `exists` against the rows (strict), then
  writes the rows and the runtime checkpoint from StartCommit in one file replace.
- Connector state: Flushed patches `{"flushes": n}`, StartedCommit `{"commits": n}`
  (both recorded by the runtime with the transaction), Acknowledged `{"acknowledged":
  n}` (recorded later, or lost to a crash), Applied `{"applied": version}`. An Open's
  `state_json` is where these come back: the driver logs it (`driver: Open … state …`).
- The rebuild sentinel: an Open whose state says commits were made (`commits` or
  `flushes` > 0, both recorded only with a commit) but whose store holds no checkpoint covering the range lost its store (the file was
  deleted): Opened answers the sentinel (`rebuild_from_zero`, bytes f8 ff ff ff 0f 01),
  and the runtime materializes everything again from an empty checkpoint.
- `--acknowledge late` (default) answers Acknowledge with Acknowledged; `early` sends
  Acknowledged right after Opened and after each StartedCommit, before the runtime's
  Acknowledge (both orders are the protocol's).

Transports: gRPC by default (binds 127.0.0.1:`--port`, a free port by default, and
prints `listening on 127.0.0.1:PORT`; grpcio's message limits raised to 64 MiB); with `--stdio`, one stream on stdin and
stdout, each message a little-endian u32 length and a protobuf frame, or with
`--codec json` one JSON line (Flow's mapping: camelCase names, `*_json` fields as raw
JSON under the name without `_json`). Errors end the stream: over gRPC as a status
(ABORTED for a fenced commit), over stdio as a last stderr line `sluice-driver-error
{"kind": "fenced" | "malformed" | "store", "message": …}` and exit status 1.
Logs go to stderr (and with `--log FILE` to that file too), one line per request
(`driver: load`, …).
"""

import argparse
import base64
import fcntl
import json
import os
import struct
import sys
import threading
from concurrent import futures

# The generated modules: on PYTHONPATH, or where the README generates them.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "generated"))

import consumer_pb2  # noqa: E402
import flow_pb2  # noqa: E402
import materialize_pb2 as m  # noqa: E402

PROTOCOL = 3032023

ENDPOINT_SCHEMA = {"type": "object"}
RESOURCE_SCHEMA = {
    "type": "object",
    "properties": {"table": {"type": "string"}},
    "required": ["table"],
}


LOG_FILE = None  # --log: a copy of every log line, appended


def log(*words):
    print("driver:", *words, file=sys.stderr, flush=True)
    if LOG_FILE is not None:
        print("driver:", *words, file=LOG_FILE, flush=True)


class Fenced(Exception):
    pass


class ProtocolViolation(Exception):
    pass


def table_of(resource_config_json):
    return json.loads(resource_config_json)["table"]


def empty_state():
    return {"tables": {}, "checkpoints": [], "opens": [], "next_token": 1, "commits": {}}


class Store:
    """The committed state, in the file at `path`: `{"tables": {materialization: {table:
    {key hex: document text}}}, "checkpoints": [[materialization, begin, end, checkpoint
    base64]], "opens": [[materialization, begin, end, token]], "next_token": n,
    "commits": {materialization: n}}`. Open and commit hold an exclusive lock on
    `path.lock` across their read and write; the file is replaced whole (rename), so a
    reader never sees half a commit."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.cached, self.signature = empty_state(), None

    def _signature(self):
        try:
            st = os.stat(self.path)
            return (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            return None

    def _read(self):
        """The file's state (cached while the file is unchanged)."""
        signature = self._signature()
        if signature != self.signature:
            if signature is None:
                self.cached = empty_state()
            else:
                with open(self.path) as f:
                    self.cached = json.load(f)
            self.signature = signature
        return self.cached

    def _write(self, state):
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        # The commit point: the rows, checkpoint and fences of this commit appear at once.
        os.replace(tmp, self.path)
        self.cached, self.signature = state, self._signature()

    def _locked(self):
        store = self

        class Locked:
            def __enter__(self):
                store.lock.acquire()
                self.file = open(store.path + ".lock", "a")
                fcntl.flock(self.file, fcntl.LOCK_EX)
                return store._read()

            def __exit__(self, *exc):
                fcntl.flock(self.file, fcntl.LOCK_UN)
                self.file.close()
                store.lock.release()

        return Locked()

    def open(self, mat, begin, end):
        """Fences every earlier Open of `mat` overlapping [begin, end]. Returns the new
        token and the checkpoint (bytes) of the narrowest committed range covering it,
        or None."""
        with self._locked() as state:
            token = state["next_token"]
            state["next_token"] = token + 1
            state["opens"].append([mat, begin, end, token])
            covering = [
                (e - b, cp)
                for n, b, e, cp in state["checkpoints"]
                if n == mat and b <= begin and end <= e
            ]
            self._write(state)
            return token, base64.b64decode(min(covering)[1]) if covering else None

    def commit(self, mat, begin, end, token, staged, checkpoint):
        """Commits `staged` rows [(table, key hex, document text or None to delete,
        exists)] and the runtime `checkpoint` (bytes) of [begin, end] together, if no
        newer Open overlaps the range (else Fenced) and every `exists` holds."""
        with self._locked() as state:
            newer = [
                t
                for n, b, e, t in state["opens"]
                if n == mat and t > token and b <= end and begin <= e
            ]
            if newer:
                raise Fenced(
                    f"fenced off: range [{begin:08x}, {end:08x}] was opened again "
                    f"(token {max(newer)} > {token})"
                )
            tables = state["tables"].setdefault(mat, {})
            present = {}
            for table, key, doc, exists in staged:
                rows = tables.get(table, {})
                was = present.get((table, key), key in rows)
                if was != exists:
                    raise ValueError(
                        f"store of key {key} in {table} with exists={exists}, "
                        f"but the key is {'present' if was else 'absent'}"
                    )
                present[(table, key)] = doc is not None
            for table, key, doc, _ in staged:
                rows = tables.setdefault(table, {})
                if doc is None:
                    rows.pop(key, None)
                else:
                    rows[key] = doc
            encoded = base64.b64encode(checkpoint).decode()
            state["checkpoints"] = [
                c for c in state["checkpoints"] if c[:3] != [mat, begin, end]
            ] + [[mat, begin, end, encoded]]
            state["commits"][mat] = state["commits"].get(mat, 0) + 1
            self._write(state)

    def drop(self, mat, tables):
        """Removes `tables` of `mat` and their rows."""
        if not tables:
            return
        with self._locked() as state:
            for table in tables:
                state["tables"].get(mat, {}).pop(table, None)
            self._write(state)

    def load(self, mat, table, key):
        with self.lock:
            return self._read()["tables"].get(mat, {}).get(table, {}).get(key)


def state_patch(**fields):
    return flow_pb2.ConnectorState(
        updated_json=json.dumps(fields).encode(), merge_patch=True
    )


class Stream:
    """One Materialize stream: `run(requests)` yields the responses."""

    def __init__(self, store, early_ack):
        self.store = store
        self.early_ack = early_ack

    def run(self, requests):
        for request in requests:
            kind = kind_of(request)
            log(kind)
            if kind == "spec":
                yield m.Response(spec=spec())
            elif kind == "validate":
                yield m.Response(validated=validated(request.validate))
            elif kind == "apply":
                yield m.Response(applied=applied(self.store, request.apply))
            elif kind == "open":
                yield from self.transactions(request.open, requests)
                return
            else:
                raise ProtocolViolation(f"expected Spec, Validate, Apply or Open, got {kind}")
        log("stream closed")

    def transactions(self, open_, requests):
        mat = open_.materialization.name
        begin, end = open_.range.key_begin, open_.range.key_end
        tables = [table_of(b.resource_config_json) for b in open_.materialization.bindings]
        state = json.loads(open_.state_json or b"{}")
        commits = state.get("commits", 0)
        flushes = state.get("flushes", 0)
        log("Open", f"[{begin:08x}, {end:08x}]", "state", json.dumps(state, sort_keys=True))
        token, checkpoint = self.store.open(mat, begin, end)
        opened = m.Response.Opened()
        if checkpoint is not None:
            opened.runtime_checkpoint.ParseFromString(checkpoint)
        elif commits > 0 or flushes > 0:
            # The state says this materialization committed (both counts are recorded
            # only with a commit), but the store has no trace of it: the store was lost.
            # Ask the runtime to start over from nothing.
            log("store lost: answering the rebuild sentinel")
            opened.runtime_checkpoint.CopyFrom(consumer_pb2.Checkpoint(rebuild_from_zero=True))
        yield m.Response(opened=opened)

        # The lifecycle of a transaction, checked: Acknowledge (once), Loads, Flush,
        # Stores, StartCommit. `acked_sent`: our Acknowledged of the previous commit is out.
        acknowledged, flushed, staged, checkpoint = False, False, [], None
        acked_sent = False
        if self.early_ack:
            yield m.Response(acknowledged=m.Response.Acknowledged())
            acked_sent = True
        for request in requests:
            kind = kind_of(request)
            log(kind)
            if kind == "acknowledge":
                if acknowledged or flushed:
                    raise ProtocolViolation("Acknowledge after Acknowledge or Flush")
                acknowledged = True
                if not acked_sent:
                    yield m.Response(acknowledged=self.acknowledged(commits))
                    acked_sent = True
            elif kind == "load":
                if flushed:
                    raise ProtocolViolation("Load after Flush")
                load = request.load
                doc = self.store.load(mat, tables[load.binding], load.key_packed.hex())
                if doc is not None:
                    yield m.Response(
                        loaded=m.Response.Loaded(binding=load.binding, doc_json=doc.encode())
                    )
            elif kind == "flush":
                if flushed or not acknowledged:
                    raise ProtocolViolation("Flush before Acknowledge, or a second Flush")
                flushed, flushes = True, flushes + 1
                yield m.Response(flushed=m.Response.Flushed(state=state_patch(flushes=flushes)))
            elif kind == "store":
                if not flushed:
                    raise ProtocolViolation("Store before Flush")
                s = request.store
                delete = s.delete or s.doc_json == b"null"
                doc = None if delete else s.doc_json.decode()
                staged.append((tables[s.binding], s.key_packed.hex(), doc, s.exists))
            elif kind == "start_commit":
                if not flushed:
                    raise ProtocolViolation("StartCommit before Flush")
                checkpoint = request.start_commit.runtime_checkpoint.SerializeToString()
                self.store.commit(mat, begin, end, token, staged, checkpoint)
                commits += 1
                yield m.Response(
                    started_commit=m.Response.StartedCommit(state=state_patch(commits=commits))
                )
                acknowledged, flushed, staged, acked_sent = False, False, [], False
                if self.early_ack:
                    # Our commit is done: nothing to wait for before acknowledging it.
                    yield m.Response(acknowledged=self.acknowledged(commits))
                    acked_sent = True
            else:
                raise ProtocolViolation(f"{kind} after Open")
        log("stream closed")

    @staticmethod
    def acknowledged(commits):
        if commits == 0:
            return m.Response.Acknowledged()
        return m.Response.Acknowledged(state=state_patch(acknowledged=commits))


def kind_of(request):
    fields = [f.name for f, _ in request.ListFields()]
    if len(fields) != 1:
        raise ProtocolViolation(f"a request with fields {fields}")
    return fields[0]


def spec():
    return m.Response.Spec(
        protocol=PROTOCOL,
        config_schema_json=json.dumps(ENDPOINT_SCHEMA).encode(),
        resource_config_schema_json=json.dumps(RESOURCE_SCHEMA).encode(),
        documentation_url="https://example.com/python-driver-current",
    )


def validated(validate):
    bindings = []
    Constraint = m.Response.Validated.Constraint
    for binding in validate.bindings:
        keys = set(binding.collection.key)
        constraints = {}
        for p in binding.collection.projections:
            if p.ptr in keys:
                kind = Constraint.LOCATION_REQUIRED
            elif p.ptr == "":
                kind = Constraint.FIELD_REQUIRED
            else:
                kind = Constraint.FIELD_OPTIONAL
            constraints[p.field] = Constraint(type=kind, reason="python current driver")
        bindings.append(
            m.Response.Validated.Binding(
                constraints=constraints,
                resource_path=[table_of(binding.resource_config_json)],
            )
        )
    return m.Response.Validated(bindings=bindings)


def applied(store, apply):
    """Describes the tables of `materialization` that `last_materialization` lacked
    (the store creates a table with its first row), and drops those it no longer has
    (a deletion is an Apply of the materialization with no bindings)."""
    before = [table_of(b.resource_config_json) for b in apply.last_materialization.bindings]
    tables = [table_of(b.resource_config_json) for b in apply.materialization.bindings]
    new = [t for t in tables if t not in before]
    gone = [t for t in before if t not in tables]
    store.drop(apply.materialization.name or apply.last_materialization.name, gone)
    return m.Response.Applied(
        action_description="".join(f"create table {t}\n" for t in new)
        + "".join(f"drop table {t}\n" for t in gone),
        state=state_patch(applied=apply.version),
    )


# ---------------------------------------------------------------------------------
# Transports.


def serve_grpc(store, early_ack, port):
    import grpc
    import materialize_pb2_grpc

    class Connector(materialize_pb2_grpc.ConnectorServicer):
        def Materialize(self, requests, context):
            try:
                yield from Stream(store, early_ack).run(requests)
            except Exception as err:
                if not context.is_active():
                    log("stream cancelled by the runtime")
                    return
                log("failed:", err)
                fenced = isinstance(err, Fenced)
                code = grpc.StatusCode.ABORTED if fenced else grpc.StatusCode.INTERNAL
                context.abort(code, str(err))

    # The runtime sends messages of up to 64 MiB (grpcio's default limit is 4 MiB).
    limits = [
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=limits)
    materialize_pb2_grpc.add_ConnectorServicer_to_server(Connector(), server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


def read_proto_frames(stdin):
    while True:
        header = stdin.read(4)
        if not header:
            return
        if len(header) < 4:
            raise ProtocolViolation("stdin ended inside a frame's length")
        (length,) = struct.unpack("<I", header)
        body = stdin.read(length)
        if len(body) < length:
            raise ProtocolViolation("stdin ended inside a frame")
        request = m.Request()
        request.ParseFromString(body)
        yield request


def write_proto_frame(stdout, response):
    body = response.SerializeToString()
    stdout.write(struct.pack("<I", len(body)) + body)
    stdout.flush()


def read_json_lines(stdin):
    for line in stdin:
        if line.strip():
            yield from_json(json.loads(line), m.Request)


def write_json_line(stdout, response):
    stdout.write(json.dumps(to_json(response), separators=(",", ":")).encode() + b"\n")
    stdout.flush()


def serve_stdio(store, early_ack, codec):
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    read, write = {
        "proto": (read_proto_frames, write_proto_frame),
        "json": (read_json_lines, write_json_line),
    }[codec]
    try:
        for response in Stream(store, early_ack).run(read(stdin)):
            write(stdout, response)
    except Exception as err:
        # Over stdio an error is the last line of stderr and a failed exit. Sluice reads
        # the error's kind from a last line `sluice-driver-error {"kind", "message"}`
        # (a fenced commit must fail as `fenced`); from any other line, the error is the
        # stderr text.
        log("failed:", err)
        kind = {Fenced: "fenced", ProtocolViolation: "malformed"}.get(type(err), "store")
        line = json.dumps({"kind": kind, "message": str(err)})
        print(f"sluice-driver-error {line}", file=sys.stderr, flush=True)
        sys.exit(1)


# ---------------------------------------------------------------------------------
# Flow's JSON mapping of these messages: proto3 JSON (camelCase names, 64-bit integers
# as strings, bytes as base64, enums by name), but a `foo_json` bytes field is the raw
# JSON value under `foo`, a `foo_json_map` map one of raw JSON values under `foo`, and
# `internal` is `$internal`.

from google.protobuf.descriptor import FieldDescriptor as F  # noqa: E402

INT64 = {F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64}


def repeated(field):
    is_repeated = getattr(field, "is_repeated", None)  # protobuf 6 and up; `label` before
    return is_repeated if isinstance(is_repeated, bool) else field.label == F.LABEL_REPEATED


# Fields whose Flow name does not follow the rule (Flow's regression snapshots).
FLOW_NAMES = {
    "access_token_response_json_map": "accessTokenResponseMap",
    "refresh_token_response_json_map": "refreshTokenResponseMap",
}


def json_key(field):
    if field.name == "internal":
        return "$internal", None
    if field.name in FLOW_NAMES:
        return FLOW_NAMES[field.name], "raw"
    for suffix in ("_json_map", "_json"):
        if field.name.endswith(suffix):
            base = field.name[: -len(suffix)]
            return camel(base), "raw"
    return field.json_name, None


def camel(name):
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def scalar_to_json(field, value, raw):
    if raw:
        return json.loads(value)
    if field.type == F.TYPE_MESSAGE:
        return to_json(value)
    if field.type == F.TYPE_ENUM:
        number = field.enum_type.values_by_number.get(value)
        return number.name if number else value
    if field.type == F.TYPE_BYTES:
        return base64.b64encode(value).decode()
    if field.type in INT64:
        return str(value)
    return value


def to_json(msg):
    out = {}
    for field, value in msg.ListFields():
        key, raw = json_key(field)
        if field.message_type and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            out[key] = {k: scalar_to_json(vfield, v, raw) for k, v in value.items()}
        elif repeated(field):
            out[key] = [scalar_to_json(field, v, raw) for v in value]
        else:
            out[key] = scalar_to_json(field, value, raw)
    return out


def scalar_from_json(field, value, raw):
    if raw:
        return json.dumps(value, separators=(",", ":")).encode()
    if field.type == F.TYPE_ENUM:
        if isinstance(value, str):
            return field.enum_type.values_by_name[value].number
        return value
    if field.type == F.TYPE_BYTES:
        return base64.b64decode(value)
    if field.type in INT64:
        return int(value)
    return value


def from_json(obj, cls_or_msg):
    msg = cls_or_msg() if isinstance(cls_or_msg, type) else cls_or_msg
    fields = {json_key(f): f for f in msg.DESCRIPTOR.fields}
    by_key = {key: (f, raw) for (key, raw), f in fields.items()}
    for key, value in obj.items():
        if key not in by_key:
            continue  # A field this driver does not know: skipped, as protobuf does.
        field, raw = by_key[key]
        target = getattr(msg, field.name)
        if field.message_type and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if vfield.type == F.TYPE_MESSAGE:
                    from_json(v, target[k])
                else:
                    target[k] = scalar_from_json(vfield, v, raw)
        elif repeated(field):
            for v in value:
                if field.type == F.TYPE_MESSAGE:
                    from_json(v, target.add())
                else:
                    target.append(scalar_from_json(field, v, raw))
        elif field.type == F.TYPE_MESSAGE:
            target.SetInParent()
            from_json(value, target)
        else:
            setattr(msg, field.name, scalar_from_json(field, value, raw))
    return msg


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True, help="the store: a JSON file")
    parser.add_argument("--stdio", action="store_true", help="one stream on stdin/stdout")
    parser.add_argument("--codec", choices=["proto", "json"], default="proto")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0: a free one)")
    parser.add_argument(
        "--acknowledge",
        choices=["late", "early"],
        default="late",
        help="send Acknowledged on Acknowledge (late) or right after each commit (early)",
    )
    parser.add_argument("--log", help="also append each log line to this file")
    args = parser.parse_args()
    global LOG_FILE
    if args.log:
        LOG_FILE = open(args.log, "a")
    store = Store(args.state)
    early = args.acknowledge == "early"
    if args.stdio:
        serve_stdio(store, early, args.codec)
    else:
        serve_grpc(store, early, args.port)


if __name__ == "__main__":
    main()
