#!/usr/bin/env python3
"""Reads an Iceberg table the Sluice Iceberg sink wrote, independently, through
pyiceberg's SqlCatalog over the same SQLite catalog file.

    read_table.py CATALOG_DB WAREHOUSE_DIR NAMESPACE.TABLE [--snapshots]

Prints each row as one JSON object per line (keys sorted), or with --snapshots each
snapshot's summary (oldest first). Exits 3 when pyiceberg is not installed.
"""
import json
import sys

try:
    from pyiceberg.catalog.sql import SqlCatalog
except ImportError as e:  # pragma: no cover
    print(f"pyiceberg is not installed: {e}", file=sys.stderr)
    sys.exit(3)


def main() -> None:
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    catalog_db, warehouse, identifier = sys.argv[1:4]
    catalog = SqlCatalog(
        "sluice",  # the catalog_name the sink writes (sluice_iceberg::CATALOG_NAME)
        uri=f"sqlite:///{catalog_db}",
        warehouse=f"file://{warehouse}",
    )
    table = catalog.load_table(identifier)
    if "--snapshots" in sys.argv[4:]:
        for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number):
            summary = snapshot.summary
            props = dict(summary.additional_properties) if summary else {}
            props["operation"] = str(summary.operation.value) if summary else None
            print(json.dumps(props, sort_keys=True))
        return
    for row in table.scan().to_arrow().to_pylist():
        print(json.dumps(row, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
