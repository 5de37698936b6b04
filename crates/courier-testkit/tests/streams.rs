//! The stream conformance suite (`courier_testkit::stream_suite`) on every
//! stream backend built here: each case runs against SQLite (a fresh file).

mod sqlite {
    courier_testkit::stream_backend_tests!(sqlite, courier_testkit::SqliteStreamFixture);
}
