use super::*;

#[test]
fn redact_hides_credentials() {
    assert_eq!(redact("redis://u:pw@h:1/0"), "redis://<credentials>@h:1/0");
    assert_eq!(redact("redis://h:1"), "redis://h:1");
}

#[test]
fn options_reject_zero() {
    let e = ClientOptions::builder()
        .command_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(e.is_invalid_input());
    assert!(ClientOptions::builder().pool_size(0).build().is_err());
}

/// `command_timeout(Duration::MAX)` panicked on the clock in every
/// call; it is refused when the client is opened.
#[test]
fn large_durations_are_refused() {
    for opts in [
        ClientOptions::builder().command_timeout(Duration::MAX),
        ClientOptions::builder().connect_timeout(Duration::MAX),
    ] {
        let e = opts.build().unwrap_err();
        assert!(
            e.is_invalid_input() && e.to_string().contains("365 days"),
            "{e}"
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Options that skipped the builder's check (the default's fields set in place) are
    // checked again when the client is opened.
    let unchecked = ClientOptions {
        command_timeout: Duration::MAX,
        runtime: Some(rt.handle().clone()),
        ..ClientOptions::default()
    };
    let e = RedisClient::open_with("redis://127.0.0.1:1", unchecked).unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
}

#[test]
fn synced_replicas_wait_must_fit_the_command_timeout() {
    let e = ClientOptions::builder()
        .synced_replicas(1, DEFAULT_COMMAND_TIMEOUT)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("below the command timeout"), "{e}");
    assert!(
        ClientOptions::builder()
            .synced_replicas(1, Duration::ZERO)
            .build()
            .is_err()
    );
    let o = ClientOptions::builder()
        .synced_replicas(2, Duration::from_millis(500))
        .build()
        .unwrap();
    assert!(o.validate().is_ok());
    // Zero replicas is off.
    let o = ClientOptions::builder()
        .synced_replicas(0, Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(o.synced_replicas(), None);
    assert!(o.validate().is_ok());
}

#[test]
fn open_outside_a_runtime_starts_a_runtime_of_its_own() {
    let client = RedisClient::open("redis://127.0.0.1:1").unwrap();
    let worker = client
        .runtime()
        .spawn(async { std::thread::current().name().map(str::to_owned) });
    let name = futures::executor::block_on(worker).unwrap();
    assert_eq!(name.as_deref(), Some("slate-client"));
    drop(client);
}

#[test]
fn tls_without_feature_is_refused() {
    if cfg!(feature = "tls") {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let e = RedisClient::open_with(
        "rediss://127.0.0.1:1",
        ClientOptions::builder()
            .runtime(rt.handle().clone())
            .build()
            .unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("`tls` feature"), "{e}");
}
