#!/usr/bin/env python3
"""Reads an Iceberg table the Sluice Iceberg sink wrote, independently, through
pyiceberg's SqlCatalog over the same SQLite catalog file.

    read_table.py CATALOG_DB WAREHOUSE NAMESPACE.TABLE [--snapshots] [--s3 SETTINGS_JSON]

WAREHOUSE is a local folder (a path or file://...) or s3://bucket/prefix. SETTINGS_JSON
is the sink's `s3` block ({"endpoint", "region", "access_key_id", "secret_access_key",
"path_style"}, each optional): pyarrow's S3 file system reads the store with them, and
with the environment's AWS_* variables for what they leave out.

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

# The sink's `s3` settings and pyiceberg's names for them.
S3_PROPERTIES = {
    "endpoint": "s3.endpoint",
    "region": "s3.region",
    "access_key_id": "s3.access-key-id",
    "secret_access_key": "s3.secret-access-key",
}


def s3_properties(settings: dict) -> dict:
    props = {S3_PROPERTIES[k]: v for k, v in settings.items() if k in S3_PROPERTIES}
    # Path-style (http://host/bucket/key) unless virtual-host addressing is asked for.
    props["s3.force-virtual-addressing"] = str(not settings.get("path_style", False)).lower()
    return props


def main() -> None:
    args = sys.argv[1:]
    s3 = None
    if "--s3" in args:
        at = args.index("--s3")
        s3 = json.loads(args[at + 1])
        del args[at : at + 2]
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    catalog_db, warehouse, identifier = args[0:3]
    if "://" not in warehouse:
        warehouse = f"file://{warehouse}"
    properties = s3_properties(s3) if s3 is not None else {}
    catalog = SqlCatalog(
        "sluice",  # the catalog_name the sink writes (sluice_iceberg::CATALOG_NAME)
        uri=f"sqlite:///{catalog_db}",
        warehouse=warehouse,
        **properties,
    )
    table = catalog.load_table(identifier)
    if "--snapshots" in args[3:]:
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
