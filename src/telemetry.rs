//! Logs to stderr (`RUST_LOG` sets the level), and OpenTelemetry traces over OTLP/gRPC when
//! an endpoint is configured (`--otlp-endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Flushes pending spans when dropped (at the end of `main`).
pub struct Guard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber. `service` names the process in traces.
pub fn init(default_level: &str, service: &str, otlp_endpoint: Option<&str>) -> Guard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let provider = otlp_endpoint
        .filter(|e| !e.is_empty())
        .and_then(|endpoint| {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build();
            match exporter {
                Ok(exporter) => Some(
                    opentelemetry_sdk::trace::SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_resource(
                            opentelemetry_sdk::Resource::builder()
                                .with_service_name(service.to_string())
                                .build(),
                        )
                        .build(),
                ),
                Err(error) => {
                    eprintln!("toolgrid: cannot set up OTLP traces to {endpoint}: {error}");
                    None
                }
            }
        });
    // The log level (RUST_LOG) filters the log lines only: traces keep every span at info,
    // whatever the logs show.
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("toolgrid"))
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init();
    Guard { provider }
}
