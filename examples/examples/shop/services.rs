//! The parts that are not stream processors: the order service (PostgreSQL and the
//! outbox), the outbox relay, and the warehouse (a real HTTP service honouring
//! `Idempotency-Key`, counting what it receives).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use clap::Parser;
use onceflow::outbox::{self, Message, RelayConfig, sqlx};
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::domain::{Order, Shipment};

#[derive(Parser, Debug)]
#[command(
    name = "shop order-service",
    about = "Takes orders over HTTP: POST /orders"
)]
struct OrderServiceArgs {
    /// The service's PostgreSQL database (its orders and its outbox).
    #[arg(long, env = "SHOP_DATABASE")]
    database: String,
    #[arg(long, env = "SHOP_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
}

/// `POST /orders` with an order as JSON: the order row and its outbox message are
/// written in one database transaction. Idempotent by order ID: a client that retries
/// after a lost answer gets 200 and nothing is written twice.
pub(crate) async fn order_service(args: Vec<OsString>) -> ExitCode {
    let args = OrderServiceArgs::parse_from(args);
    init_logs();
    let pool = match connect(&args.database).await {
        Ok(pool) => pool,
        Err(code) => return code,
    };
    let schema = "CREATE TABLE IF NOT EXISTS shop_orders (
        id text PRIMARY KEY, customer text NOT NULL, item text NOT NULL,
        quantity bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())";
    if let Err(error) = install(&pool, schema).await {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let app = axum::Router::new()
        .route("/orders", post(take_order))
        .with_state(pool);
    serve(args.listen, app, "order service").await
}

async fn take_order(
    State(pool): State<PgPool>,
    Json(order): Json<Order>,
) -> (StatusCode, Json<serde_json::Value>) {
    if order.id.is_empty() {
        let answer = json!({"error": "an order needs an ID"});
        return (StatusCode::BAD_REQUEST, Json(answer));
    }
    match store_order(&pool, &order).await {
        Ok(true) => (StatusCode::CREATED, Json(json!({"order": order.id}))),
        Ok(false) => (
            StatusCode::OK,
            Json(json!({"order": order.id, "duplicate": true})),
        ),
        Err(error) => {
            tracing::warn!(order = %order.id, %error, "order not taken");
            let answer = json!({"error": error.to_string()});
            (StatusCode::SERVICE_UNAVAILABLE, Json(answer))
        }
    }
}

/// Whether the order is new; a new one is stored with its outbox message.
async fn store_order(pool: &PgPool, order: &Order) -> onceflow::Result<bool> {
    let mut tx = pool.begin().await.map_err(outbox::db_error)?;
    let inserted = sqlx::query(
        "INSERT INTO shop_orders (id, customer, item, quantity) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&order.id)
    .bind(&order.customer)
    .bind(&order.item)
    .bind(i64::from(order.quantity))
    .execute(&mut *tx)
    .await
    .map_err(outbox::db_error)?
    .rows_affected()
        == 1;
    if inserted {
        // Keyed by item: the inventory keeps an item's stock on one partition.
        outbox::enqueue(&mut tx, &Message::json("orders", &order.item, order)?).await?;
    }
    tx.commit().await.map_err(outbox::db_error)?;
    Ok(inserted)
}

#[derive(Parser, Debug)]
#[command(
    name = "shop relay",
    about = "Publishes the order service's outbox to Kafka, exactly once"
)]
struct RelayArgs {
    /// The order service's database.
    #[arg(long, env = "SHOP_DATABASE")]
    database: String,
    #[arg(long, env = "ONCEFLOW_BROKERS", default_value = "localhost:9092")]
    brokers: String,
    /// Relays of one name share the work: one is active, the others stand by.
    #[arg(long, default_value = "shop")]
    name: String,
    /// A librdkafka property for the relay's clients (security), KEY=VALUE; repeatable.
    #[arg(long = "kafka", value_name = "KEY=VALUE")]
    kafka: Vec<String>,
}

/// The outbox relay until SIGTERM or SIGINT.
pub(crate) async fn relay(args: Vec<OsString>) -> ExitCode {
    let args = RelayArgs::parse_from(args);
    init_logs();
    let pool = match connect(&args.database).await {
        Ok(pool) => pool,
        Err(code) => return code,
    };
    // The service may not have started yet: the table is the relay's to read.
    if let Err(error) = outbox::install(&pool).await {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let mut config = RelayConfig::new(args.brokers, args.name);
    for pair in &args.kafka {
        match pair.split_once('=') {
            Some((key, value)) => config.kafka_properties.push((key.into(), value.into())),
            None => {
                eprintln!("error: --kafka {pair}: expected KEY=VALUE");
                return ExitCode::from(2);
            }
        }
    }
    match outbox::relay(pool, config, stop_signal()).await {
        Ok(stats) => {
            tracing::info!(?stats, "relay stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "shop warehouse",
    about = "Ships what it is asked to: POST /shipments, GET /shipments"
)]
struct WarehouseArgs {
    /// The warehouse's own database.
    #[arg(long, env = "SHOP_WAREHOUSE_DATABASE")]
    database: String,
    #[arg(long, env = "SHOP_WAREHOUSE_LISTEN", default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
}

/// The warehouse: a shipment per idempotency key however often it is asked; every
/// request counted.
pub(crate) async fn warehouse(args: Vec<OsString>) -> ExitCode {
    let args = WarehouseArgs::parse_from(args);
    init_logs();
    let pool = match connect(&args.database).await {
        Ok(pool) => pool,
        Err(code) => return code,
    };
    let schema = "CREATE TABLE IF NOT EXISTS shop_shipments (
            idempotency_key text PRIMARY KEY, order_id text NOT NULL, customer text NOT NULL,
            item text NOT NULL, quantity bigint NOT NULL);
        CREATE TABLE IF NOT EXISTS shop_shipment_requests (
            id bigserial PRIMARY KEY, idempotency_key text NOT NULL)";
    if let Err(error) = install(&pool, schema).await {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let app = axum::Router::new()
        .route("/shipments", post(ship).get(shipments))
        .with_state(pool);
    serve(args.listen, app, "warehouse").await
}

async fn ship(
    State(pool): State<PgPool>,
    headers: HeaderMap,
    Json(shipment): Json<Shipment>,
) -> (StatusCode, Json<serde_json::Value>) {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
    else {
        let answer = json!({"error": "no Idempotency-Key header"});
        return (StatusCode::BAD_REQUEST, Json(answer));
    };
    let stored = async {
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO shop_shipment_requests (idempotency_key) VALUES ($1)")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        let new = sqlx::query(
            "INSERT INTO shop_shipments (idempotency_key, order_id, customer, item, quantity)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(key)
        .bind(&shipment.order)
        .bind(&shipment.customer)
        .bind(&shipment.item)
        .bind(i64::from(shipment.quantity))
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        tx.commit().await?;
        Ok::<bool, sqlx::Error>(new)
    };
    match stored.await {
        Ok(true) => (StatusCode::CREATED, Json(json!({"shipment": key}))),
        // The same key again: the first answer, nothing shipped twice.
        Ok(false) => (StatusCode::OK, Json(json!({"shipment": key}))),
        Err(error) => {
            let answer = json!({"error": error.to_string()});
            (StatusCode::SERVICE_UNAVAILABLE, Json(answer))
        }
    }
}

/// Every shipment and the number of requests received.
async fn shipments(State(pool): State<PgPool>) -> (StatusCode, Json<serde_json::Value>) {
    let read = async {
        let requests: i64 = sqlx::query("SELECT count(*) FROM shop_shipment_requests")
            .fetch_one(&pool)
            .await?
            .try_get(0)?;
        let rows = sqlx::query(
            "SELECT idempotency_key, order_id, customer, item, quantity FROM shop_shipments
             ORDER BY idempotency_key",
        )
        .fetch_all(&pool)
        .await?;
        let mut shipped = Vec::with_capacity(rows.len());
        for row in rows {
            shipped.push(json!({
                "key": row.try_get::<String, _>(0)?,
                "order": row.try_get::<String, _>(1)?,
                "customer": row.try_get::<String, _>(2)?,
                "item": row.try_get::<String, _>(3)?,
                "quantity": row.try_get::<i64, _>(4)?,
            }));
        }
        Ok::<_, sqlx::Error>(json!({"requests": requests, "shipments": shipped}))
    };
    match read.await {
        Ok(body) => (StatusCode::OK, Json(body)),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": error.to_string()})),
        ),
    }
}

async fn connect(url: &str) -> Result<PgPool, ExitCode> {
    PgPool::connect(url).await.map_err(|error| {
        eprintln!("error: cannot connect to the database: {error}");
        ExitCode::FAILURE
    })
}

/// The outbox table and `schema` (statements separated by `;`), in one transaction.
async fn install(pool: &PgPool, schema: &str) -> onceflow::Result<()> {
    outbox::install(pool).await?;
    let mut tx = pool.begin().await.map_err(outbox::db_error)?;
    for statement in schema.split(';') {
        sqlx::query(statement)
            .execute(&mut *tx)
            .await
            .map_err(outbox::db_error)?;
    }
    tx.commit().await.map_err(outbox::db_error)
}

/// Serves `app` on `address` until SIGTERM or SIGINT.
async fn serve(address: SocketAddr, app: axum::Router, what: &str) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: the {what} cannot listen on {address}: {error}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(%address, "{what} listening");
    match axum::serve(listener, app)
        .with_graceful_shutdown(stop_signal())
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: the {what} stopped: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
}
