"""An external materialization driver written with Python's grpcio, as a connector author
would write one against materialize.proto: authoritative, in-memory, fenced.

- Every Open takes a fence token for its key range; a commit fails with ABORTED
  ("fenced off") once a newer Open overlaps the range.
- A commit applies the staged stores and records the runtime checkpoint (from Prepare)
  together, under one lock, after checking the fence and the `exists` flags; Opened
  returns that checkpoint (of the narrowest committed range covering the opened one).
- Loads are answered from the committed table, in request order: a Load of T+1 read
  after Commit of T sees T's stores.
- State is per materialization. After each commit the tables are written to `--state`
  (JSON, `{materialization: {table: {key hex: doc}}}`) for the test to compare with the
  expected reduction.

Run: `python3 driver.py --state FILE` with `materialize_pb2*` importable (the test
generates them with grpcio-tools); it prints `listening on 127.0.0.1:PORT`, then logs one
line per call or request to stderr.
"""

import argparse
import json
import os
import sys
import threading
from concurrent import futures

import grpc

import flow_pb2
import materialize_pb2 as m
import materialize_pb2_grpc

ENDPOINT_SCHEMA = json.dumps({"type": "object"})
RESOURCE_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"table": {"type": "string"}},
        "required": ["table"],
    }
)


def log(*words):
    print("driver:", *words, file=sys.stderr, flush=True)


def sliced(arena, slices):
    return [bytes(arena[s.begin : s.end]) for s in slices]


def table_of(binding):
    return json.loads(binding.resource_spec_json)["table"]


class Store:
    """The committed state every stream of this process shares."""

    def __init__(self, state_path):
        self.lock = threading.Lock()
        self.state_path = state_path
        self.tables = {}  # (materialization, table) -> {packed key: document JSON}
        self.checkpoints = {}  # (materialization, begin, end) -> runtime checkpoint
        self.opens = []  # (materialization, begin, end, token) of every Open
        self.next_token = 1

    def open(self, mat, begin, end):
        """Fences every earlier Open of `mat` overlapping [begin, end]; returns the new
        token and the checkpoint of the narrowest committed range covering it (b"" if
        none)."""
        with self.lock:
            token = self.next_token
            self.next_token += 1
            self.opens.append((mat, begin, end, token))
            covering = [
                (e - b, cp)
                for (n, b, e), cp in self.checkpoints.items()
                if n == mat and b <= begin and end <= e
            ]
            return token, min(covering)[1] if covering else b""

    def commit(self, mat, begin, end, token, staged, checkpoint):
        with self.lock:
            newer = [
                t
                for n, b, e, t in self.opens
                if n == mat and t > token and b <= end and begin <= e
            ]
            if newer:
                raise Fenced(
                    f"fenced off: range [{begin:08x}, {end:08x}] was opened again "
                    f"(token {max(newer)} > {token})"
                )
            for table, key, doc, exists in staged:
                present = key in self.tables.get((mat, table), {})
                if present != exists:
                    raise ValueError(
                        f"store of key {key.hex()} in {table} with exists={exists}, "
                        f"but the key is {'present' if present else 'absent'}"
                    )
            for table, key, doc, _ in staged:
                rows = self.tables.setdefault((mat, table), {})
                if doc == b"null":
                    rows.pop(key, None)
                else:
                    rows[key] = doc
            self.checkpoints[(mat, begin, end)] = checkpoint
            self.write_state()

    def load(self, mat, table, keys):
        with self.lock:
            rows = self.tables.get((mat, table), {})
            return [rows[k] for k in keys if k in rows]

    def write_state(self):
        state = {}
        for (mat, table), rows in self.tables.items():
            docs = {key.hex(): json.loads(doc) for key, doc in sorted(rows.items())}
            state.setdefault(mat, {})[table] = docs
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.state_path)


class Fenced(Exception):
    pass


def response(**field):
    return m.TransactionResponse(**field)


class Driver(materialize_pb2_grpc.DriverServicer):
    def __init__(self, store):
        self.store = store
        self.applied = set()

    def Spec(self, request, context):
        log("Spec")
        return m.SpecResponse(
            endpoint_spec_schema_json=ENDPOINT_SCHEMA,
            resource_spec_schema_json=RESOURCE_SCHEMA,
        )

    def Validate(self, request, context):
        log("Validate")
        bindings = []
        for binding in request.bindings:
            keys = set(binding.collection.key_ptrs)
            constraints = {}
            for p in binding.collection.projections:
                if p.ptr in keys:
                    kind = m.Constraint.LOCATION_REQUIRED
                elif p.ptr == "":
                    kind = m.Constraint.FIELD_REQUIRED
                else:
                    kind = m.Constraint.FIELD_OPTIONAL
                constraints[p.field] = m.Constraint(type=kind, reason="grpcio driver")
            bindings.append(
                m.ValidateResponse.Binding(
                    constraints=constraints,
                    resource_path=[json.loads(binding.resource_spec_json)["table"]],
                )
            )
        return m.ValidateResponse(bindings=bindings)

    def ApplyUpsert(self, request, context):
        log("ApplyUpsert")
        tables = [table_of(b) for b in request.materialization.bindings]
        new = [t for t in tables if t not in self.applied]
        if not request.dry_run:
            self.applied.update(new)
        return m.ApplyResponse(action_description="".join(f"create {t}\n" for t in new))

    def ApplyDelete(self, request, context):
        log("ApplyDelete")
        return m.ApplyResponse()

    def Transactions(self, requests, context):
        try:
            yield from self.transactions(requests)
        except Exception as err:
            if not context.is_active():
                log("stream cancelled by the runtime")
                return
            log("failed:", err)
            fenced = isinstance(err, Fenced)
            code = grpc.StatusCode.ABORTED if fenced else grpc.StatusCode.INTERNAL
            context.abort(code, str(err))

    def transactions(self, requests):
        # Headers go out with the first yielded message (grpcio's way): nothing before
        # Opened, so a runtime that awaits headers before sending Open hangs here.
        first = next(requests, None)
        if first is None:
            return
        if self.kind(first) != "open":
            raise ValueError(f"expected Open, got {self.kind(first)}")
        open_ = first.open
        log("Open", f"[{open_.key_begin:08x}, {open_.key_end:08x}]")
        mat = open_.materialization.materialization
        begin, end = open_.key_begin, open_.key_end
        tables = [table_of(b) for b in open_.materialization.bindings]
        token, checkpoint = self.store.open(mat, begin, end)
        yield response(opened=m.TransactionResponse.Opened(flow_checkpoint=checkpoint))
        staged, prepared = [], b""
        # The lifecycle, checked: the load phase (one Acknowledge, Loads, then Prepare
        # once acknowledged), then the store phase (Stores, then Commit).
        storing, acknowledged = False, False
        for request in requests:
            kind = self.kind(request)
            log(kind)
            allowed = {
                "acknowledge": not storing and not acknowledged,
                "load": not storing,
                "prepare": not storing and acknowledged,
                "store": storing,
                "commit": storing,
            }
            if not allowed.get(kind, False):
                phase = "store" if storing else "load"
                raise ValueError(
                    f"{kind.capitalize()} is not allowed in the {phase} phase"
                )
            if kind == "acknowledge":
                acknowledged = True
                yield response(acknowledged=m.TransactionResponse.Acknowledged())
            elif kind == "load":
                load = request.load
                keys = sliced(load.arena, load.packed_keys)
                docs = self.store.load(mat, tables[load.binding], keys)
                if docs:
                    yield response(loaded=loaded(load.binding, docs))
            elif kind == "prepare":
                storing, prepared = True, request.prepare.flow_checkpoint
                yield response(
                    prepared=flow_pb2.DriverCheckpoint(
                        driver_checkpoint_json=b"{}", rfc7396_merge_patch=True
                    )
                )
            elif kind == "store":
                store = request.store
                keys = sliced(store.arena, store.packed_keys)
                docs = sliced(store.arena, store.docs_json)
                table = tables[store.binding]
                staged.extend(
                    (table, k, d, e) for k, d, e in zip(keys, docs, store.exists)
                )
            elif kind == "commit":
                self.store.commit(mat, begin, end, token, staged, prepared)
                staged, storing, acknowledged = [], False, False
                yield response(driver_committed=m.TransactionResponse.DriverCommitted())
        log("stream closed")

    @staticmethod
    def kind(request):
        fields = [f.name for f, _ in request.ListFields()]
        if len(fields) != 1:
            raise ValueError(f"a request with fields {fields}")
        return fields[0]


def loaded(binding, docs):
    arena, slices = bytearray(), []
    for doc in docs:
        slices.append(flow_pb2.Slice(begin=len(arena), end=len(arena) + len(doc)))
        arena += doc
    return m.TransactionResponse.Loaded(
        binding=binding, arena=bytes(arena), docs_json=slices
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    args = parser.parse_args()
    # The runtime sends documents of up to 64 MiB messages (grpcio's default is 4 MiB).
    limits = [
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=limits)
    materialize_pb2_grpc.add_DriverServicer_to_server(Driver(Store(args.state)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
