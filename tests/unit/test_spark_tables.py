"""cdcd.spark.tables without a Spark session: where the mirror and changelog tables are, by format."""

from __future__ import annotations

from cdcd.spark.tables import DeltaTables, IcebergTables, Where, iceberg_catalog_conf


def test_delta_tables_are_paths() -> None:
    where = Where("s3a://lake/mirror/", "shop", "items")
    assert DeltaTables.path(where) == "s3a://lake/mirror/shop/items"
    assert DeltaTables().name(where) == "delta.`s3a://lake/mirror/shop/items`"


def test_iceberg_tables_are_catalog_names_under_the_root_namespace() -> None:
    tables = IcebergTables("lake")
    assert tables.name(Where("mirror", "shop", "items")) == "`lake`.`mirror`.`shop`.`items`"
    assert tables.name(Where("cdc.mirror", "odd`schema", "t")) == "`lake`.`cdc`.`mirror`.`odd``schema`.`t`"


def test_iceberg_catalogs() -> None:
    assert iceberg_catalog_conf("lake", "/w", None) == {
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lake.type": "hadoop",
        "spark.sql.catalog.lake.warehouse": "/w",
    }
    assert iceberg_catalog_conf("lake", "prod", "https://catalog:8181") == {
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lake.type": "rest",
        "spark.sql.catalog.lake.uri": "https://catalog:8181",
        "spark.sql.catalog.lake.warehouse": "prod",
    }
    assert iceberg_catalog_conf("lake", None, None) == {}  # configured with --conf
