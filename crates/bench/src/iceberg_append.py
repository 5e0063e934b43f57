"""The pyiceberg baseline of `sluice bench iceberg`: what a user would write to load the
same rows without Sluice. Reads JSON lines, builds a pyarrow table, creates an Iceberg
table in a SQLite SqlCatalog and appends it; prints {"rows": N, "secs": S}, S timed
from the first line read to the committed append (creating the catalog is not timed).

    iceberg_append.py ROWS_JSONL CATALOG_DB WAREHOUSE_DIR
"""
import json
import os
import sys
import time

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog


def main() -> None:
    rows_path, catalog_db, warehouse = sys.argv[1:4]
    os.makedirs(warehouse, exist_ok=True)
    catalog = SqlCatalog("bench", uri=f"sqlite:///{catalog_db}", warehouse=f"file://{warehouse}")
    catalog.create_namespace_if_not_exists("bench")
    started = time.perf_counter()
    with open(rows_path) as f:
        rows = [json.loads(line) for line in f]
    table = pa.Table.from_pylist(rows)
    iceberg = catalog.create_table("bench.pageviews", schema=table.schema)
    iceberg.append(table)
    secs = time.perf_counter() - started
    print(json.dumps({"rows": len(rows), "secs": secs}))


if __name__ == "__main__":
    main()
