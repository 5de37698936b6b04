//! The daemon's logs and traces: one global `tracing` subscriber that writes
//! logs to stderr (as [`crate::init_logging`]) and, with `[otel] endpoint`
//! (and the `otel` feature), exports spans to an OpenTelemetry collector over
//! OTLP/HTTP with protobuf.
//!
//! Exported: the spans of Courier's own crates at `info` and above, whatever
//! `RUST_LOG` says of logs — chiefly each delivery's `courier.deliver`,
//! whose parent is its producer's span (see `courier::trace_context`). The
//! SDK's batch processor sends them from a thread of its own, every few
//! seconds and at [`Telemetry::shutdown`].
//!
//! Without `[otel]` no exporter exists, no thread starts and no network is
//! touched. Failure: a collector that is down or refuses spans costs those
//! spans only (the SDK reports it through its own logs); delivery never waits
//! on export.

use crate::config::{Config, LogFormat};

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The OTLP exporter could not be built.
    #[error("cannot set up OpenTelemetry export to {endpoint}: {reason}")]
    Exporter {
        /// Where spans were to go.
        endpoint: String,
        /// The exporter's error.
        reason: String,
    },
}

/// What [`init_telemetry`] started; [`Telemetry::shutdown`] flushes it.
#[derive(Debug, Default)]
#[must_use = "shut it down to export the last spans"]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans not yet sent and stops the exporter (waiting for the
    /// collector at most the exporter's timeout); nothing without `[otel]`.
    pub async fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider {
            // The batch processor's thread does the sending; waiting for it
            // blocks, so not on a runtime thread.
            let stopped = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(error)) = stopped {
                eprintln!("courier: OpenTelemetry export did not shut down cleanly: {error}");
            }
        }
    }
}

/// Installs the global `tracing` subscriber: logs in `config.log_format` to
/// stderr filtered by `RUST_LOG` (default `info`), and with `[otel]` a
/// `tracing-opentelemetry` layer exporting to `{endpoint}/v1/traces`. Does
/// nothing if a subscriber is installed already.
pub fn init_telemetry(config: &Config) -> Result<Telemetry, TelemetryError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let logs = match config.log_format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
    };
    #[cfg(feature = "otel")]
    {
        let (traces, provider) = match &config.otel {
            Some(otel) => {
                let (layer, provider) = otel::layer(otel)?;
                (Some(layer), Some(provider))
            }
            None => (None, None),
        };
        let _ = tracing_subscriber::registry()
            .with(logs)
            .with(traces)
            .try_init();
        Ok(Telemetry { provider })
    }
    #[cfg(not(feature = "otel"))]
    {
        // `Config::validate` refuses `[otel]` in a build without the feature.
        let _ = tracing_subscriber::registry().with(logs).try_init();
        Ok(Telemetry::default())
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::Resource;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;

    use super::TelemetryError;
    use crate::config::OtelSection;

    /// The crates whose spans are exported (a prefix: `courier_engine`,
    /// `courier_server`, … all match).
    const EXPORTED_TARGETS: &str = "courier";

    /// The exporting layer and the provider that owns its batch processor.
    pub(super) fn layer<S>(
        otel: &OtelSection,
    ) -> Result<(Box<dyn Layer<S> + Send + Sync>, SdkTracerProvider), TelemetryError>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        let url = otel.traces_url();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .build()
            .map_err(|error| TelemetryError::Exporter {
                endpoint: url,
                reason: error.to_string(),
            })?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(otel.service_name.clone())
                    .build(),
            )
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("courier"))
            .with_filter(Targets::new().with_target(EXPORTED_TARGETS, LevelFilter::INFO))
            .boxed();
        Ok((layer, provider))
    }
}
