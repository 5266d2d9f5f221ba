use super::*;

fn flags(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(f, v)| (f.to_string(), v.to_string()))
        .collect()
}

fn with_flags(list: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::load(None, &flags(list))
}

#[test]
fn both_documents() {
    let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: /m\ncontainerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\nclusterDNS: [10.96.0.10]\nclusterDomain: edge.local.\nhealthzPort: 0\nreadOnlyPort: 10255\nenableSystemLogHandler: false\n---\nkind: NanoletConfiguration\nstateDir: /s\nruntime: {name: crun}\ninsecureRegistries: [\"127.0.0.1:5000\"]\n";
    let c = Config::parse(text, Path::new("c.yaml")).unwrap();
    assert_eq!(c.static_pod_path, Some(PathBuf::from("/m")));
    assert_eq!(c.container_log_max_size, 1 << 20);
    assert_eq!(c.container_log_max_files, 3);
    assert_eq!(c.state_dir, PathBuf::from("/s"));
    assert_eq!(c.runtime, RuntimeKind::Crun);
    assert_eq!(c.runtime_path, PathBuf::from("crun"));
    assert_eq!(c.insecure_registries, vec!["127.0.0.1:5000".to_string()]);
    assert_eq!(
        c.cluster_dns,
        vec!["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(c.cluster_domain, "edge.local");
    assert_eq!(c.healthz_port, 0);
    assert_eq!(c.read_only_port, 10255);
    assert_eq!(Config::default().read_only_port, 0);
    assert!(!c.enable_system_log_handler);
    assert!(Config::default().enable_system_log_handler);
    assert_eq!(Config::default().healthz_port, 10248);
}

#[test]
fn unknown_key_names_key_and_file() {
    let err = Config::parse(
        "kind: KubeletConfiguration\nstaticPodPth: /m\n",
        Path::new("/etc/n.yaml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("/etc/n.yaml"), "{err}");
    assert!(err.contains("staticPodPth"), "{err}");
}

#[test]
fn invalid_values() {
    assert!(Config::parse("containerLogMaxSize: ten\n", Path::new("c")).is_err());
    assert!(
        Config::parse(
            "kind: NanoletConfiguration\nruntime: {name: docker}\n",
            Path::new("c")
        )
        .is_err()
    );
    assert!(Config::parse("kind: Other\n", Path::new("c")).is_err());
    assert!(Config::parse("a: [\n", Path::new("c")).is_err());
    assert_eq!(Config::default().oom_score_adj, -999);
    let c = Config::parse("oomScoreAdj: -500\n", Path::new("c")).unwrap();
    assert_eq!(c.oom_score_adj, -500);
    let err = Config::parse("oomScoreAdj: -1001\n", Path::new("c")).unwrap_err();
    assert!(err.to_string().contains("oomScoreAdj"), "{err}");
}

#[test]
fn eviction_thresholds_as_upstream_validates_them() {
    let defaults = Config::default().eviction;
    assert_eq!(defaults.hard(Signal::MemoryAvailable, 0), Some(100 << 20));
    assert_eq!(defaults.hard(Signal::ImagefsAvailable, 1000), Some(150));
    let c = Config::parse(
        "evictionHard: {memory.available: 1Gi, pid.available: 10%}\nevictionSoft: {memory.available: 2Gi}\nevictionSoftGracePeriod: {memory.available: 90s}\nevictionMaxPodGracePeriod: 20\nevictionPressureTransitionPeriod: 1m\nevictionMinimumReclaim: {memory.available: 0Mi, nodefs.available: 5%}\n",
        Path::new("c"),
    )
    .unwrap();
    let e = &c.eviction;
    assert_eq!(e.hard(Signal::MemoryAvailable, 0), Some(1 << 30));
    assert_eq!(e.hard(Signal::PidAvailable, 1000), Some(100));
    // Given, the map replaces the defaults.
    assert_eq!(e.hard(Signal::NodefsAvailable, 1000), None);
    let soft = e.thresholds.iter().find(|t| t.grace.is_some()).unwrap();
    assert_eq!(soft.value, ThresholdValue::Quantity(2 << 30));
    assert_eq!(soft.grace, Some(Duration::from_secs(90)));
    assert_eq!(e.max_pod_grace, Duration::from_secs(20));
    assert_eq!(e.transition_period, Duration::from_secs(60));
    assert_eq!(e.min_reclaim(Signal::NodefsAvailable, 1000), 50);
    assert_eq!(e.min_reclaim(Signal::MemoryAvailable, 1000), 0);
    assert_eq!(e.min_reclaim(Signal::PidAvailable, 1000), 0);
    for bad in [
        "evictionMinimumReclaim: {memory.free: 1Gi}\n",
        "evictionMinimumReclaim: {nodefs.available: 200%}\n",
        "evictionHard: {memory.free: 1Gi}\n",
        "evictionHard: {nodefs.available: 120%}\n",
        "evictionSoft: {memory.available: 1Gi}\n",
    ] {
        assert!(Config::parse(bad, Path::new("c")).is_err(), "{bad}");
    }
    let c = with_flags(&[(
        "eviction-hard",
        "memory.available<500Mi,nodefs.available<5%",
    )])
    .unwrap();
    assert_eq!(c.eviction.thresholds.len(), 2);
    assert_eq!(c.eviction.hard(Signal::NodefsAvailable, 100), Some(5));
    assert!(with_flags(&[("eviction-hard", "memory.available=1Gi")]).is_err());
    assert!(with_flags(&[("eviction-hard", "memory.free<1Gi")]).is_err());
}

#[test]
fn kubelet_api_authentication_and_authorization_as_upstream_names_them() {
    assert_eq!(Config::default().api_auth, ApiAuth::default());
    let c = Config::parse(
        "authentication:\n  x509: {clientCAFile: /ca.crt}\n  webhook: {enabled: false, cacheTTL: 10s}\n  anonymous: {enabled: true}\nauthorization:\n  mode: AlwaysAllow\n  webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 5s}\n",
        Path::new("c"),
    )
    .unwrap();
    assert_eq!(c.client_ca_file, Some(PathBuf::from("/ca.crt")));
    assert_eq!(
        c.api_auth,
        ApiAuth {
            anonymous: true,
            token_webhook: false,
            token_cache_ttl: Duration::from_secs(10),
            mode: AuthorizationMode::AlwaysAllow,
            allowed_cache_ttl: Duration::from_secs(60),
            denied_cache_ttl: Duration::from_secs(5),
        }
    );
    assert!(Config::parse("authorization: {mode: RBAC}\n", Path::new("c")).is_err());
    let c = with_flags(&[
        ("anonymous-auth", "true"),
        ("authorization-mode", "AlwaysAllow"),
        ("authorization-webhook-cache-unauthorized-ttl", "1s"),
    ])
    .unwrap();
    assert!(with_flags(&[("anonymous-auth", "yes")]).is_err());
    assert!(c.api_auth.anonymous);
    assert_eq!(c.api_auth.mode, AuthorizationMode::AlwaysAllow);
    assert_eq!(c.api_auth.denied_cache_ttl, Duration::from_secs(1));
}

#[test]
fn runtime_and_its_path_mean_the_same_in_either_order() {
    for order in [
        [("runtime-path", "/opt/crun"), ("runtime", "crun")],
        [("runtime", "crun"), ("runtime-path", "/opt/crun")],
    ] {
        let c = with_flags(&order).unwrap();
        assert_eq!(
            (c.runtime, c.runtime_path),
            (RuntimeKind::Crun, PathBuf::from("/opt/crun"))
        );
    }
    let err = with_flags(&[("runtime", "crun"), ("no-such-flag", "1")]).unwrap_err();
    assert!(
        matches!(&err, ConfigError::UnknownFlag(f) if f == "no-such-flag"),
        "{err}"
    );
}

#[test]
fn image_gc_fields_as_upstream_validates_them() {
    let c = Config::parse(
        "imageGCHighThresholdPercent: 70\nimageGCLowThresholdPercent: 40\nimageMinimumGCAge: 0s\nimageMaximumGCAge: 24h\n---\nkind: NanoletConfiguration\npinnedImages: [busybox]\nimageLimits: {layerSize: 1Gi, layerEntries: 10}\nlayerContents: {fifos: refuse, devices: refuse, setuid: strip}\n",
        Path::new("c"),
    )
    .unwrap();
    assert_eq!(
        (
            c.image_gc_high_threshold_percent,
            c.image_gc_low_threshold_percent
        ),
        (70, 40)
    );
    assert_eq!(c.image_minimum_gc_age, Duration::ZERO);
    assert_eq!(c.image_maximum_gc_age, Some(Duration::from_secs(86400)));
    assert_eq!(c.pinned_images, vec!["busybox".to_string()]);
    assert_eq!(
        (c.max_layer_size, c.max_image_size, c.max_layer_entries),
        (1 << 30, 16 << 30, 10)
    );
    assert_eq!(
        (c.layer_fifos, c.layer_refuse_devices, c.layer_setuid),
        (false, true, false)
    );
    assert!(
        Config::parse(
            "kind: NanoletConfiguration\nlayerContents: {devices: create}\n",
            Path::new("c")
        )
        .is_err()
    );
    let d = Config::default();
    assert_eq!(
        (
            d.image_gc_high_threshold_percent,
            d.image_gc_low_threshold_percent,
            d.image_minimum_gc_age,
            d.image_maximum_gc_age
        ),
        (85, 80, Duration::from_secs(120), None)
    );
    for bad in [
        "imageGCHighThresholdPercent: 101\n",
        "imageGCLowThresholdPercent: -1\n",
        "imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 50\n",
        "imageMaximumGCAge: 1m\n",
    ] {
        let err = Config::parse(bad, Path::new("c")).unwrap_err().to_string();
        assert!(err.contains("image"), "{bad}: {err}");
    }
}

#[test]
fn a_bootstrap_needs_a_kubeconfig_to_write_and_the_cert_dir_defaults_under_the_state() {
    let err = with_flags(&[("bootstrap-kubeconfig", "/b")]).unwrap_err();
    assert!(err.to_string().contains("needs kubeconfig"), "{err}");
    let c = with_flags(&[
        ("bootstrap-kubeconfig", "/b"),
        ("kubeconfig", "/k"),
        ("state-dir", "/s"),
    ])
    .unwrap();
    assert_eq!(c.cert_dir(), Path::new("/s/pki"));
    assert!(!c.rotate_certificates && !c.server_tls_bootstrap);
    let c = Config::parse(
        "kind: KubeletConfiguration\nrotateCertificates: true\nserverTLSBootstrap: true\n---\nkind: NanoletConfiguration\ncertDir: /p\n",
        Path::new("c"),
    )
    .unwrap();
    assert!(c.rotate_certificates && c.server_tls_bootstrap);
    assert_eq!(c.cert_dir(), Path::new("/p"));
}
