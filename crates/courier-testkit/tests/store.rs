//! The store conformance suite (`courier_testkit::store_suite`) on every
//! backend: each case runs once against PostgreSQL (a fresh schema) and once
//! against SQLite (a fresh file).

mod postgres {
    courier_testkit::store_conformance_tests!(postgres, courier_testkit::PgFixture);
}

mod sqlite {
    courier_testkit::store_conformance_tests!(sqlite, courier_testkit::SqliteFixture);
}
