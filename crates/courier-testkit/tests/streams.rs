//! The stream conformance suite (`courier_testkit::stream_suite`) on every
//! stream backend: each case runs against PostgreSQL (a fresh schema) and
//! SQLite (a fresh file).

mod postgres {
    courier_testkit::stream_backend_tests!(postgres, courier_testkit::PgStreamFixture);
}

mod sqlite {
    courier_testkit::stream_backend_tests!(sqlite, courier_testkit::SqliteStreamFixture);
}
