"""The pyiceberg side of `sluice bench iceberg --mode upsert`: its baseline, and its
reader of tables.

    upsert.py upsert DOCS_JSONL ROUND_DOCS CATALOG_DB WAREHOUSE_DIR
    upsert.py inspect CATALOG_NAME CATALOG_DB WAREHOUSE_DIR NAMESPACE.TABLE

upsert: what a user would write instead of Sluice. Reads the documents as JSON lines in
rounds of ROUND_DOCS; reduces each round per key in Python onto what the rounds before
left (views and bytes summed, last_seen the largest, tags merged, later values winning);
then upserts the round's reduced rows (one per key the round touched) into an Iceberg
table of a SQLite SqlCatalog with pyiceberg's own Table.upsert(df, join_cols=[user_id]).
Prints {"docs": D, "rounds": R, "secs": S}, S timed from the first line read to the last
committed upsert (creating the catalog is not timed). The reductions stay in this
process's memory between rounds, which spares it the reads Sluice's loads do.

inspect: the table's current snapshot as pyiceberg reads it (position deletes applied):
{"rows": N, "views": V, "data_files": F, "delete_files": G}.
"""
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFileContent

SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("views", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("last_seen", pa.string(), nullable=False),
        pa.field("tags", pa.string()),
    ]
)


def fold(rows, doc):
    """Folds one document into its key's reduction in `rows`; returns the key."""
    key = doc["user_id"]
    row = rows.get(key)
    if row is None:
        doc["tags"] = dict(doc.get("tags") or {})
        rows[key] = doc
        return key
    row["views"] += doc["views"]
    row["bytes"] += doc["bytes"]
    # RFC 3339 timestamps of one offset order as text.
    if doc["last_seen"] > row["last_seen"]:
        row["last_seen"] = doc["last_seen"]
    row["tags"].update(doc.get("tags") or {})
    return key


def arrow_rows(rows, keys):
    """The reductions of `keys` as a table of SCHEMA (tags as JSON text)."""
    picked = [rows[k] for k in keys]
    return pa.Table.from_pydict(
        {
            "user_id": [r["user_id"] for r in picked],
            "views": [r["views"] for r in picked],
            "bytes": [r["bytes"] for r in picked],
            "last_seen": [r["last_seen"] for r in picked],
            "tags": [json.dumps(r["tags"], sort_keys=True) for r in picked],
        },
        schema=SCHEMA,
    )


def upsert(docs_path, round_docs, catalog_db, warehouse):
    os.makedirs(warehouse, exist_ok=True)
    catalog = SqlCatalog("bench", uri=f"sqlite:///{catalog_db}", warehouse=f"file://{warehouse}")
    catalog.create_namespace_if_not_exists("bench")
    started = time.perf_counter()
    table = catalog.create_table("bench.pageviews", schema=SCHEMA)
    rows, touched, docs, rounds = {}, set(), 0, 0
    with open(docs_path) as f:
        for line in f:
            touched.add(fold(rows, json.loads(line)))
            docs += 1
            if docs % round_docs == 0:
                table.upsert(arrow_rows(rows, touched), join_cols=["user_id"])
                touched, rounds = set(), rounds + 1
    if touched:
        table.upsert(arrow_rows(rows, touched), join_cols=["user_id"])
        rounds += 1
    secs = time.perf_counter() - started
    print(json.dumps({"docs": docs, "rounds": rounds, "secs": secs}))


def inspect(catalog_name, catalog_db, warehouse, identifier):
    catalog = SqlCatalog(catalog_name, uri=f"sqlite:///{catalog_db}", warehouse=f"file://{warehouse}")
    table = catalog.load_table(identifier)
    snapshot = table.current_snapshot()
    files = {DataFileContent.DATA: 0}
    for manifest in snapshot.manifests(table.io) if snapshot else []:
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            content = entry.data_file.content
            files[content] = files.get(content, 0) + 1
    views = table.scan(selected_fields=("views",)).to_arrow()["views"]
    data = files.pop(DataFileContent.DATA)
    print(
        json.dumps(
            {
                "rows": len(views),
                "views": pc.sum(views).as_py() or 0,
                "data_files": data,
                "delete_files": sum(files.values()),
            }
        )
    )


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "upsert":
        docs_path, round_docs, catalog_db, warehouse = args
        upsert(docs_path, int(round_docs), catalog_db, warehouse)
    elif command == "inspect":
        inspect(*args)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
