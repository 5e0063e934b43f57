"""The pyiceberg baseline of `sluice bench iceberg`: what a user would write instead of
Sluice. Reads the same input documents as JSON lines, reduces them per key in Python
as the collection's schema says (views and bytes summed, last_seen the largest, tags
merged, later values winning), builds a pyarrow table of the reduced rows, creates an
Iceberg table in a SQLite SqlCatalog and appends it. Prints
{"rows": N, "docs": D, "views": V, "secs": S}, S timed from the first line read to the
committed append (creating the catalog is not timed).

    iceberg_append.py DOCS_JSONL CATALOG_DB WAREHOUSE_DIR
"""
import json
import os
import sys
import time

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog


def reduce_documents(path):
    """The documents of `path`, reduced per user_id; and how many there were."""
    views = {}
    docs = 0
    with open(path) as f:
        for line in f:
            doc = json.loads(line)
            docs += 1
            row = views.get(doc["user_id"])
            if row is None:
                doc["tags"] = dict(doc.get("tags") or {})
                views[doc["user_id"]] = doc
                continue
            row["views"] += doc["views"]
            row["bytes"] += doc["bytes"]
            # RFC 3339 timestamps of one offset order as text.
            if doc["last_seen"] > row["last_seen"]:
                row["last_seen"] = doc["last_seen"]
            row["tags"].update(doc.get("tags") or {})
    return list(views.values()), docs


def main() -> None:
    docs_path, catalog_db, warehouse = sys.argv[1:4]
    os.makedirs(warehouse, exist_ok=True)
    catalog = SqlCatalog("bench", uri=f"sqlite:///{catalog_db}", warehouse=f"file://{warehouse}")
    catalog.create_namespace_if_not_exists("bench")
    started = time.perf_counter()
    rows, docs = reduce_documents(docs_path)
    table = pa.Table.from_pylist(rows)
    iceberg = catalog.create_table("bench.pageviews", schema=table.schema)
    iceberg.append(table)
    secs = time.perf_counter() - started
    total = sum(row["views"] for row in rows)
    print(json.dumps({"rows": len(rows), "docs": docs, "views": total, "secs": secs}))


if __name__ == "__main__":
    main()
