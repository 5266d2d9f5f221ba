//! A container (init, sidecar, app or ephemeral) from its API object.

use super::*;

/// An ephemeral container is a container without what upstream forbids
/// it (ports, probes, hooks, resources, restart or resize policy), and
/// with an optional target for its PID namespace.
pub(super) fn convert_ephemeral(
    c: &core::EphemeralContainer,
    field: &str,
    host_network: bool,
    volumes: &[Volume],
    pod_seccomp: &Option<SeccompProfile>,
) -> Result<Container, PodError> {
    let forbidden = [
        ("ports", c.ports.as_ref().is_some_and(|p| !p.is_empty())),
        ("livenessProbe", c.liveness_probe.is_some()),
        ("readinessProbe", c.readiness_probe.is_some()),
        ("startupProbe", c.startup_probe.is_some()),
        ("lifecycle", c.lifecycle.is_some()),
        (
            "resources",
            c.resources.as_ref().is_some_and(|r| {
                r.limits.as_ref().is_some_and(|l| !l.is_empty())
                    || r.requests.as_ref().is_some_and(|l| !l.is_empty())
            }),
        ),
        ("resizePolicy", c.resize_policy.is_some()),
        ("restartPolicy", c.restart_policy.is_some()),
    ];
    if let Some((name, _)) = forbidden.iter().find(|(_, set)| *set) {
        return Err(invalid(
            format!("{field}.{name}"),
            "Forbidden: cannot be set for an Ephemeral Container",
        ));
    }
    // The same fields as a container's, but one: a round trip through the
    // wire form converts it.
    let mut wire = serde_json::to_value(c).map_err(|e| invalid(field.to_owned(), e.to_string()))?;
    if let Some(fields) = wire.as_object_mut() {
        fields.remove("targetContainerName");
    }
    let as_container: core::Container =
        serde_json::from_value(wire).map_err(|e| invalid(field.to_owned(), e.to_string()))?;
    let mut container = convert_container(
        &as_container,
        field,
        host_network,
        volumes,
        pod_seccomp.clone(),
    )?;
    container.role = ContainerRole::Ephemeral;
    container.target = c.target_container_name.clone().filter(|t| !t.is_empty());
    Ok(container)
}

pub(super) fn convert_container(
    c: &core::Container,
    field: &str,
    host_network: bool,
    volumes: &[Volume],
    pod_seccomp: Option<SeccompProfile>,
) -> Result<Container, PodError> {
    dns_label(&format!("{field}.name"), &c.name, 63)?;
    let image = c
        .image
        .clone()
        .filter(|i| !i.trim().is_empty())
        .ok_or_else(|| invalid(format!("{field}.image"), "required"))?;
    let pull_policy = match c.image_pull_policy.as_deref() {
        Some("Always") => PullPolicy::Always,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        Some("Never") => PullPolicy::Never,
        None => default_pull_policy(&image),
        Some(other) => {
            return Err(invalid(
                format!("{field}.imagePullPolicy"),
                format!("unknown value {other:?}"),
            ));
        }
    };
    let input = Input {
        stdin: c.stdin == Some(true),
        stdin_once: c.stdin_once == Some(true),
        tty: c.tty == Some(true),
    };
    let termination_message_from_logs = match c.termination_message_policy.as_deref() {
        None | Some("File") => false,
        Some("FallbackToLogsOnError") => true,
        Some(other) => {
            return Err(invalid(
                format!("{field}.terminationMessagePolicy"),
                format!("unknown value {other:?}"),
            ));
        }
    };
    let termination_message_path = c
        .termination_message_path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/dev/termination-log".into());
    if !termination_message_path.starts_with('/')
        || termination_message_path.split('/').any(|p| p == "..")
    {
        return Err(invalid(
            format!("{field}.terminationMessagePath"),
            "must be an absolute path without '..'",
        ));
    }
    for (i, port) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.container_port) {
            return Err(invalid(
                format!("{field}.ports[{i}].containerPort"),
                "must be 1-65535",
            ));
        }
        match port.host_port {
            Some(host_port) if !(0..=65535).contains(&host_port) => {
                return Err(invalid(
                    format!("{field}.ports[{i}].hostPort"),
                    "must be 0-65535",
                ));
            }
            // As upstream: on the host network there is nothing to map.
            Some(host_port) if host_network && host_port != port.container_port => {
                return Err(invalid(
                    format!("{field}.ports[{i}].hostPort"),
                    "must match `containerPort` when `hostNetwork` is true",
                ));
            }
            _ => {}
        }
        if let Some(ip) = port.host_ip.as_deref().filter(|ip| !ip.is_empty())
            && ip.parse::<std::net::IpAddr>().is_err()
        {
            return Err(invalid(
                format!("{field}.ports[{i}].hostIP"),
                "must be a valid IP address",
            ));
        }
    }
    let mut env = Vec::new();
    for (i, e) in c.env.iter().flatten().enumerate() {
        let efield = format!("{field}.env[{i}]");
        if e.name.is_empty() || e.name.contains('=') {
            return Err(invalid(
                format!("{efield}.name"),
                format!("{:?} is not a valid name", e.name),
            ));
        }
        let value = match (&e.value, &e.value_from) {
            (_, None) => EnvValue::Literal(e.value.clone().unwrap_or_default()),
            (Some(v), Some(_)) if !v.is_empty() => {
                return Err(invalid(
                    format!("{efield}.valueFrom"),
                    "may not be set when value is not empty",
                ));
            }
            (_, Some(from)) => env_value_from(&format!("{efield}.valueFrom"), from)?,
        };
        env.push(EnvVar {
            name: e.name.clone(),
            value,
        });
    }
    let mut env_from = Vec::new();
    for (i, e) in c.env_from.iter().flatten().enumerate() {
        let efield = format!("{field}.envFrom[{i}]");
        let (secret, name, optional) = match (&e.config_map_ref, &e.secret_ref) {
            (Some(cm), None) => (false, cm.name.clone(), cm.optional),
            (None, Some(s)) => (true, s.name.clone(), s.optional),
            _ => {
                return Err(invalid(
                    efield,
                    "exactly one of configMapRef or secretRef is required",
                ));
            }
        };
        env_from.push(EnvFrom {
            secret,
            name,
            prefix: e.prefix.clone().unwrap_or_default(),
            optional: optional.unwrap_or(false),
        });
    }
    let security = c.security_context.as_ref();
    let sfield = format!("{field}.securityContext");
    let privileged = security.and_then(|s| s.privileged) == Some(true);
    if privileged && security.and_then(|s| s.allow_privilege_escalation) == Some(false) {
        return Err(invalid(
            sfield.clone(),
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
        ));
    }
    let proc_unmasked = match security.and_then(|s| s.proc_mount.as_deref()) {
        None | Some("Default") => false,
        Some("Unmasked") => true,
        Some(other) => {
            return Err(invalid(
                format!("{sfield}.procMount"),
                format!("unknown value {other:?}"),
            ));
        }
    };
    let capabilities = security.and_then(|s| s.capabilities.as_ref());
    let container_security = Security {
        privileged,
        capabilities_add: capability_names(
            &format!("{sfield}.capabilities.add"),
            capabilities.and_then(|c| c.add.as_ref()),
        )?,
        capabilities_drop: capability_names(
            &format!("{sfield}.capabilities.drop"),
            capabilities.and_then(|c| c.drop.as_ref()),
        )?,
        seccomp: seccomp_profile(&sfield, security.and_then(|s| s.seccomp_profile.as_ref()))?
            .or(pod_seccomp)
            .unwrap_or_default(),
        // Set by the caller, which knows the pod's annotations and profile.
        apparmor: None,
        proc_unmasked,
    };
    let resources = c.resources.as_ref();
    let rfield = format!("{field}.resources");
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let to_u64 =
        |v: Option<u128>, div: u128| v.map(|v| u64::try_from(v.div_ceil(div)).unwrap_or(u64::MAX));
    let extended = extended_resources(requests, limits, &rfield)?;
    let cpu_limit = to_u64(resource(limits, &format!("{rfield}.limits"), "cpu")?, 1);
    let memory_limit = to_u64(
        resource(limits, &format!("{rfield}.limits"), "memory")?,
        1000,
    );
    // As the API server defaults them: a limit without a request is also the request.
    let cpu_request =
        to_u64(resource(requests, &format!("{rfield}.requests"), "cpu")?, 1).or(cpu_limit);
    let memory_request = to_u64(
        resource(requests, &format!("{rfield}.requests"), "memory")?,
        1000,
    )
    .or(memory_limit);
    let ephemeral_limit = to_u64(
        resource(limits, &format!("{rfield}.limits"), "ephemeral-storage")?,
        1000,
    );
    let ephemeral_request = to_u64(
        resource(requests, &format!("{rfield}.requests"), "ephemeral-storage")?,
        1000,
    )
    .or(ephemeral_limit);
    if let (Some(r), Some(l)) = (ephemeral_request, ephemeral_limit)
        && r > l
    {
        return Err(invalid(
            format!("{rfield}.requests.ephemeral-storage"),
            "must not exceed the limit",
        ));
    }
    if let (Some(r), Some(l)) = (memory_request, memory_limit)
        && r > l
    {
        return Err(invalid(
            format!("{rfield}.requests.memory"),
            "must not exceed the limit",
        ));
    }
    if let (Some(r), Some(l)) = (cpu_request, cpu_limit)
        && r > l
    {
        return Err(invalid(
            format!("{rfield}.requests.cpu"),
            "must not exceed the limit",
        ));
    }
    let mut mounts = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mfield = format!("{field}.volumeMounts[{i}]");
        let Some(volume) = volumes.iter().find(|v| v.name == m.name) else {
            return Err(invalid(
                format!("{mfield}.name"),
                format!("no volume named {:?}", m.name),
            ));
        };
        if !m.mount_path.starts_with('/') || m.mount_path.split('/').any(|p| p == "..") {
            return Err(invalid(
                format!("{mfield}.mountPath"),
                "must be absolute and without '..'",
            ));
        }
        let sub_path = m.sub_path.clone().filter(|p| !p.is_empty());
        let sub_path_expr = m.sub_path_expr.clone().filter(|p| !p.is_empty());
        if sub_path.is_some() && sub_path_expr.is_some() {
            return Err(invalid(
                format!("{mfield}.subPathExpr"),
                "subPathExpr and subPath are mutually exclusive",
            ));
        }
        for (name, sub) in [("subPath", &sub_path), ("subPathExpr", &sub_path_expr)] {
            if let Some(sub) = sub
                && !super::is_local_path(sub)
            {
                return Err(invalid(
                    format!("{mfield}.{name}"),
                    "must be a relative path without '..'",
                ));
            }
        }
        let expanded_later = sub_path_expr.is_some();
        let sub_path = sub_path.or(sub_path_expr);
        let propagation = match m.mount_propagation.as_deref() {
            None | Some("None") => "rprivate",
            Some("HostToContainer") => "rslave",
            Some("Bidirectional") if privileged => "rshared",
            Some("Bidirectional") => {
                return Err(invalid(
                    format!("{mfield}.mountPropagation"),
                    "Bidirectional mount propagation is available only to privileged containers",
                ));
            }
            Some(other) => {
                return Err(invalid(
                    format!("{mfield}.mountPropagation"),
                    format!("unknown value {other:?}"),
                ));
            }
        };
        let recursive_read_only = match m.recursive_read_only.as_deref() {
            None | Some("Disabled") => super::RecursiveReadOnly::Disabled,
            Some(value @ ("IfPossible" | "Enabled")) => {
                // Upstream's validation.
                if m.read_only != Some(true) {
                    return Err(invalid(
                        format!("{mfield}.recursiveReadOnly"),
                        "may only be specified when readOnly is true",
                    ));
                }
                if propagation != "rprivate" {
                    return Err(invalid(
                        format!("{mfield}.recursiveReadOnly"),
                        "may only be specified when mountPropagation is None or not specified",
                    ));
                }
                if value == "Enabled" {
                    super::RecursiveReadOnly::Enabled
                } else {
                    super::RecursiveReadOnly::IfPossible
                }
            }
            Some(other) => {
                return Err(invalid(
                    format!("{mfield}.recursiveReadOnly"),
                    format!("unknown value {other:?}"),
                ));
            }
        };
        mounts.push(VolumeMount {
            recursive_read_only,
            volume: m.name.clone(),
            path: m.mount_path.clone(),
            // The files the agent writes are read-only to containers
            // whatever the pod says, as upstream's since CVE-2017-1002102.
            read_only: m.read_only.unwrap_or(false)
                || matches!(volume.source, VolumeSource::Projected(_)),
            sub_path,
            sub_path_expr: expanded_later,
            propagation,
        });
    }
    let probes = super::probe::convert_probes(field, c)?;
    let hooks = super::probe::convert_hooks(field, c)?;
    let stop_signal = c.lifecycle.as_ref().and_then(|l| l.stop_signal.clone());
    if let Some(signal) = &stop_signal
        && !super::signal::is_linux_stop_signal(signal)
    {
        return Err(invalid(
            format!("{field}.lifecycle.stopSignal"),
            format!(
                "Unsupported value: {signal:?}: not a Linux signal name (SIGTERM, SIGQUIT, SIGRTMIN+1, ...)"
            ),
        ));
    }
    Ok(Container {
        probes,
        hooks,
        stop_signal,
        termination_message_path,
        termination_message_from_logs,
        input,
        role: ContainerRole::Regular,
        target: None,
        restart_on_resize: restart_on_resize(c, field)?,
        name: c.name.clone(),
        image,
        pull_policy,
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        env,
        env_from,
        working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
        run_as_user: id_from(
            &format!("{field}.securityContext.runAsUser"),
            security.and_then(|s| s.run_as_user),
        )?,
        run_as_group: id_from(
            &format!("{field}.securityContext.runAsGroup"),
            security.and_then(|s| s.run_as_group),
        )?,
        run_as_non_root: security.and_then(|s| s.run_as_non_root).unwrap_or(false),
        read_only_root: security
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        no_new_privileges: security.and_then(|s| s.allow_privilege_escalation) == Some(false),
        security: container_security,
        resources: Resources {
            cpu_request_milli: cpu_request,
            cpu_limit_milli: cpu_limit,
            memory_request,
            memory_limit,
            extended,
            ephemeral_request,
            ephemeral_limit,
        },
        mounts,
    })
}

pub(super) fn env_value_from(field: &str, from: &core::EnvVarSource) -> Result<EnvValue, PodError> {
    let key_ref = |r: &core::ConfigMapKeySelector| (r.name.clone(), r.key.clone(), r.optional);
    let value = match (
        &from.field_ref,
        &from.resource_field_ref,
        &from.config_map_key_ref,
        &from.secret_key_ref,
    ) {
        (Some(f), None, None, None) => {
            let path = f.field_path.as_str();
            let known = matches!(
                path,
                "metadata.name"
                    | "metadata.namespace"
                    | "metadata.uid"
                    | "spec.nodeName"
                    | "spec.serviceAccountName"
                    | "status.hostIP"
                    | "status.hostIPs"
                    | "status.podIP"
                    | "status.podIPs"
            ) || path.starts_with("metadata.labels['")
                || path.starts_with("metadata.annotations['");
            if !known {
                return Err(unsupported(format!("{field}.fieldRef.fieldPath={path}")));
            }
            EnvValue::Field(path.to_owned())
        }
        (None, Some(r), None, None) => {
            EnvValue::Resource(resource_ref(&format!("{field}.resourceFieldRef"), r)?)
        }
        (None, None, Some(r), None) => {
            let (name, key, optional) = key_ref(r);
            EnvValue::ConfigMapKey {
                name,
                key,
                optional: optional.unwrap_or(false),
            }
        }
        (None, None, None, Some(r)) => EnvValue::SecretKey {
            name: r.name.clone(),
            key: r.key.clone(),
            optional: r.optional.unwrap_or(false),
        },
        _ => {
            return Err(invalid(
                field,
                "exactly one of fieldRef, resourceFieldRef, configMapKeyRef or secretKeyRef is required",
            ));
        }
    };
    Ok(value)
}

/// Upstream's default: Always for `:latest` or no tag, else IfNotPresent.
pub fn default_pull_policy(image: &str) -> PullPolicy {
    if image.contains('@') {
        return PullPolicy::IfNotPresent;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => PullPolicy::Always,
        Some(_) => PullPolicy::IfNotPresent,
    }
}
