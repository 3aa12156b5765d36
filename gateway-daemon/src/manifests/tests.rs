use super::*;
use crate::model::Snapshot;

#[test]
fn a_snapshot_patched_file_by_file_equals_one_copied_whole() {
    let parse = |name: &str, text: &str| parse_file(Path::new(name), text);
    let a = parse(
        "a.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {name: web, namespace: a}\nspec: {parentRefs: [{name: gw}]}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n",
    );
    let b = parse(
        "b.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: UDPRoute\n\
             metadata: {name: dns, namespace: b}\nspec: {parentRefs: [{name: gw}]}\n",
    );
    let a2 = parse(
        "a.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {name: db, namespace: a}\nspec: {parentRefs: [{name: gw}]}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {name: web, namespace: a}\nspec: {parentRefs: [{name: gw}]}\n",
    );
    let none = Counts::default();
    let mut s = Snapshot::default();
    let ca = splice(&mut s, none, none, &a.objects);
    let cb = splice(&mut s, ca, none, &b.objects);
    assert_eq!(s, snapshot([&a, &b]));
    // a.yaml changes: b's objects stay after a's new ones.
    let ca2 = splice(&mut s, none, ca, &a2.objects);
    assert_eq!(s, snapshot([&a2, &b]));
    // b.yaml goes, then a.yaml.
    splice(&mut s, ca2, cb, &[]);
    assert_eq!(s, snapshot([&a2]));
    splice(&mut s, none, ca2, &[]);
    assert_eq!(s, Snapshot::default());
}

#[test]
fn a_bad_field_is_reported_with_file_document_object_and_path() {
    let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
                    apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                    metadata: {name: web, namespace: team-a}\n\
                    spec:\n  parentRefs:\n  - name: gw\n    port: seventy\n";
    let parsed = parse_file(Path::new("routes.yaml"), text);
    assert_eq!(parsed.objects.len(), 1);
    let err = parsed.errors[0].to_string();
    assert!(
        err.starts_with(
            "routes.yaml document 2: TCPRoute team-a/web: field spec.parentRefs[0].port"
        ),
        "{err}"
    );
}

#[test]
fn a_creation_time_that_is_no_rfc_3339_time_is_an_error_naming_the_field() {
    for kind in ["TCPRoute", "Gateway"] {
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\n\
             metadata: {{name: web, namespace: team-a, creationTimestamp: yesterday}}\n\
             spec: {{parentRefs: [{{name: gw}}], gatewayClassName: berth, listeners: []}}\n"
        );
        let parsed = parse_file(Path::new("objects.yaml"), &text);
        assert!(parsed.objects.is_empty(), "{kind}");
        let err = parsed.errors[0].to_string();
        assert!(
            err.contains(&format!(
                "{kind} team-a/web: field metadata.creationTimestamp"
            )) && err.contains("RFC 3339"),
            "{err}"
        );
    }
}

#[test]
fn names_that_kubernetes_would_refuse_are_errors_naming_the_object_and_field() {
    let route = |name: &str, ns: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata:\n  \
                 name: {name}\n  namespace: {ns}\nspec: {{}}\n"
        )
    };
    for (name, ns, field) in [
        ("\"web\\nx\"", "team-a", "metadata.name"),
        ("Web", "team-a", "metadata.name"),
        ("web-", "team-a", "metadata.name"),
        ("web", "Team_A", "metadata.namespace"),
    ] {
        let parsed = parse_file(Path::new("r.yaml"), &route(name, ns));
        assert!(parsed.objects.is_empty(), "{name} in {ns} accepted");
        let message = parsed.errors[0].to_string();
        assert!(
            message.contains("TCPRoute") && message.contains(field),
            "{message}"
        );
    }
    let ok = parse_file(Path::new("r.yaml"), &route("web.v2", "team-a"));
    assert!(ok.errors.is_empty(), "{:?}", ok.errors);
    let long = "a".repeat(64);
    let svc = format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {long}\n  namespace: a\n");
    assert!(!parse_file(Path::new("s.yaml"), &svc).errors.is_empty());
}

#[test]
fn a_yaml_syntax_error_is_reported_once() {
    let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\ngarbage: [\n";
    let parsed = parse_file(Path::new("x.yaml"), text);
    assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
    assert!(
        parsed.errors[0]
            .to_string()
            .starts_with("x.yaml document 1: not YAML"),
        "{}",
        parsed.errors[0]
    );
}

#[test]
fn unknown_kinds_are_noted_and_v1alpha2_routes_accepted() {
    let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\n\
                    apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: UDPRoute\n\
                    metadata: {name: dns}\nspec: {}\n";
    let parsed = parse_file(Path::new("x.yaml"), text);
    assert_eq!(parsed.ignored.len(), 1, "{:?}", parsed.ignored);
    assert!(matches!(&parsed.objects[0], Object::Route(r) if r.kind == RouteKind::Udp));
}

#[test]
fn unknown_fields_warn_with_file_object_and_path_and_upstream_fields_do_not() {
    let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                    metadata: {name: web, namespace: a, annotations: {x: y}, labelz: {}}\n\
                    spec:\n  parentRef: [{name: gw}]\n  parentRefs:\n  \
                    - {name: gw, sectionname: pool}\n  rules: [{name: r, backendRefs: \
                    [{name: web, port: 80, weight: 1}]}]\n---\n\
                    apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
                    metadata: {name: gw, namespace: a}\nspec:\n  gatewayClassName: berth\n  \
                    infrastructure: {labels: {team: a}}\n  listeners:\n  - name: pool\n    \
                    protocol: TCP\n    port: 30000\n    hostname: x.example\n    \
                    tls: {mode: Passthrough, options: {k: v}}\n    colour: red\n\
                    status: {anything: [1]}\n---\n\
                    apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: a}\n\
                    spec: {type: ClusterIP, selector: {app: web}, portz: [], \
                    ports: [{port: 80, appProtocol: tcp}]}\n---\n\
                    apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\n\
                    metadata: {name: c, namespace: a}\nspec: {listeners: [{name: pool, \
                    endPort: 30010, maxPorts: 3}]}\n";
    let parsed = parse_file(Path::new("a.yaml"), text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(parsed.objects.len(), 4);
    assert_eq!(
        parsed.warnings,
        [
            "a.yaml document 1: TCPRoute a/web: unknown field \"metadata.labelz\"",
            "a.yaml document 1: TCPRoute a/web: unknown field \"spec.parentRef\"",
            "a.yaml document 1: TCPRoute a/web: unknown field \"spec.parentRefs[0].sectionname\"",
            "a.yaml document 2: Gateway a/gw: unknown field \"spec.listeners[0].colour\"",
            "a.yaml document 3: Service a/web: unknown field \"spec.portz\"",
            "a.yaml document 4: GatewayConfig a/c: unknown field \"spec.listeners[0].maxPorts\"",
        ]
    );
}

#[test]
fn an_object_defined_twice_is_an_error_of_the_later_definition_naming_both() {
    let route = |port: u16| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                 metadata: {{name: web, namespace: a}}\n\
                 spec: {{parentRefs: [{{name: gw, port: {port}}}]}}\n"
        )
    };
    let dir = std::env::temp_dir().join(format!("berth-defs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("a.yaml"), route(1)).expect("write");
    std::fs::write(dir.join("b.yaml"), route(2)).expect("write");
    // The same name as a UDPRoute is another object; twice in one file is not.
    let twice = format!(
        "{}---\n{}",
        route(3).replace("web", "w2"),
        route(4).replace("web", "w2")
    );
    std::fs::write(
        dir.join("c.yaml"),
        twice.clone() + "---\n" + &route(5).replace("TCP", "UDP"),
    )
    .expect("write");
    let files = load_dir(&dir).expect("load");
    let errors: Vec<Vec<String>> = files
        .iter()
        .map(|(_, f)| f.errors.iter().map(ToString::to_string).collect())
        .collect();
    let a = dir.join("a.yaml").display().to_string();
    let (b, c) = (a.replace("a.yaml", "b.yaml"), a.replace("a.yaml", "c.yaml"));
    assert_eq!(
        errors,
        [
            vec![],
            vec![format!(
                "{b} document 1: TCPRoute a/web: also defined in {a} document 1, which stays \
                     in force (an object may be defined once)"
            )],
            vec![format!(
                "{c} document 2: TCPRoute a/w2: also defined in {c} document 1, which stays \
                     in force (an object may be defined once)"
            )],
        ]
    );
    // Replacing a file's own definitions is no conflict; once a file lets go of an
    // object, another may define it.
    let mut defs = Definitions::default();
    let (fa, fb) = (&files[0].1, &files[1].1);
    defs.replace(Path::new(&a), &FileObjects::default(), fa)
        .expect("first");
    defs.replace(Path::new(&a), fa, fa)
        .expect("same file again");
    assert!(defs
        .replace(Path::new(&b), &FileObjects::default(), fb)
        .is_err());
    defs.replace(Path::new(&a), fa, &FileObjects::default())
        .expect("let go");
    defs.replace(Path::new(&b), &FileObjects::default(), fb)
        .expect("now b");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_larger_than_the_limit_is_an_error_naming_it_and_is_not_parsed() {
    let dir = std::env::temp_dir().join(format!("berth-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("large.yaml");
    // A valid route, then comments past the limit.
    let mut text = "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                    metadata: {name: web, namespace: a}\nspec: {}\n"
        .to_string();
    let line = "# padding padding padding padding padding padding padding padding\n";
    while text.len() as u64 <= super::MAX_FILE_BYTES {
        text.push_str(line);
    }
    std::fs::write(&path, &text).expect("write");
    let parsed = super::read_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(parsed.objects.is_empty(), "{:?}", parsed.objects);
    assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
    let e = parsed.errors[0].to_string();
    assert!(
        e.contains("large.yaml") && e.contains("larger than the 16 MiB"),
        "{e}"
    );
}

const TCP_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
    metadata: {name: web, namespace: a}\nspec: {}\n";

#[test]
fn a_gateway_api_kind_berth_does_not_serve_is_noted_and_its_neighbours_served() {
    let text = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
         metadata: {{name: site, namespace: a}}\nspec: {{hostnames: [a.example]}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\n\
         metadata: {{name: tls, namespace: a}}\nspec: {{}}\n---\n{TCP_ROUTE}"
    );
    let parsed = parse_file(Path::new("x.yaml"), &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert!(matches!(&parsed.objects[..], [Object::Route(r)] if r.metadata.name == "web"));
    assert_eq!(
        parsed.ignored,
        [
            "x.yaml document 1: HTTPRoute a/site (gateway.networking.k8s.io/v1) ignored: \
             Berth serves TCPRoute and UDPRoute, not this kind",
            "x.yaml document 2: TLSRoute a/tls (gateway.networking.k8s.io/v1alpha2) ignored: \
             Berth serves TCPRoute and UDPRoute, not this kind",
        ]
    );
    // A kind Berth serves, in a version it does not read, is still an error.
    let v9 = TCP_ROUTE.replace("/v1\n", "/v9\n");
    let parsed = parse_file(Path::new("x.yaml"), &v9);
    assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
}

#[test]
fn the_items_of_a_list_are_read_as_objects_and_named_by_item() {
    let text = "apiVersion: v1\nkind: List\nitems:\n\
        - apiVersion: gateway.networking.k8s.io/v1\n  kind: TCPRoute\n  \
          metadata: {name: web, namespace: a}\n  spec: {}\n\
        - apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: d, namespace: a}\n\
        - apiVersion: gateway.networking.k8s.io/v1\n  kind: UDPRoute\n  \
          metadata: {name: Bad, namespace: a}\n  spec: {}\n";
    let parsed = parse_file(Path::new("x.yaml"), text);
    assert!(matches!(&parsed.objects[..], [Object::Route(r)] if r.metadata.name == "web"));
    assert_eq!(
        parsed.ignored,
        ["x.yaml document 1: List item 2: Deployment a/d (apps/v1) ignored"]
    );
    assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
    let e = parsed.errors[0].to_string();
    assert!(
        e.starts_with("x.yaml document 1: List item 3: UDPRoute a/Bad: field metadata.name"),
        "{e}"
    );
}

#[test]
fn json_files_are_read_one_value_or_list_or_several() {
    let route = |name: &str| {
        format!(
            r#"{{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
                "metadata": {{"name": "{name}", "namespace": "a"}}, "spec": {{}}}}"#
        )
    };
    let names = |p: &FileObjects| -> Vec<String> {
        p.objects
            .iter()
            .map(|o| match o {
                Object::Route(r) => r.metadata.name.to_string(),
                _ => "?".to_string(),
            })
            .collect()
    };
    let one = parse_file(Path::new("x.json"), &route("one"));
    assert_eq!(names(&one), ["one"], "{:?}", one.errors);
    let list = format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [{}, {}]}}"#,
        route("a"),
        route("b")
    );
    let list = parse_file(Path::new("x.json"), &list);
    assert_eq!(names(&list), ["a", "b"], "{:?}", list.errors);
    let stream = parse_file(
        Path::new("x.json"),
        &format!("{}\n{}", route("c"), route("d")),
    );
    assert_eq!(names(&stream), ["c", "d"], "{:?}", stream.errors);
    assert_eq!(stream.documents, [0, 1]);
    let broken = parse_file(Path::new("x.json"), "{\"apiVersion\": ");
    assert_eq!(broken.errors.len(), 1);
    assert!(
        broken.errors[0]
            .to_string()
            .starts_with("x.json document 1: not JSON"),
        "{}",
        broken.errors[0]
    );
}

#[test]
fn names_follow_kubernetes_per_kind_253_for_routes_63_for_services() {
    let route = |name: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {{name: {name}, namespace: a}}\nspec: {{}}\n"
        )
    };
    for ok in [
        "r".repeat(64),
        "r".repeat(253),
        format!("{}.v2", "r".repeat(100)),
    ] {
        let parsed = parse_file(Path::new("r.yaml"), &route(&ok));
        assert!(parsed.errors.is_empty(), "{ok}: {:?}", parsed.errors);
    }
    let parsed = parse_file(Path::new("r.yaml"), &route(&"r".repeat(254)));
    assert!(
        parsed.errors[0].to_string().contains("longer than 253"),
        "{:?}",
        parsed.errors
    );
    let service = |name: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name:?}, namespace: a}}\n")
    };
    for bad in ["s".repeat(64), "1web".to_string()] {
        let parsed = parse_file(Path::new("s.yaml"), &service(&bad));
        assert_eq!(parsed.errors.len(), 1, "Service {bad} accepted");
    }
}

#[test]
fn listener_names_are_section_names_and_errors_name_object_and_field() {
    let gateway = |listener: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
             metadata: {{name: gw, namespace: infra}}\n\
             spec:\n  gatewayClassName: berth\n  listeners:\n  \
             - {{name: ok, protocol: TCP, port: 1}}\n  \
             - {{name: {listener:?}, protocol: TCP, port: 2}}\n"
        )
    };
    for bad in ["tcp\"pool", "tcp\npool", "Tcp", "-tcp", "tcp.pool", ""] {
        let parsed = parse_file(Path::new("g.yaml"), &gateway(bad));
        assert!(parsed.objects.is_empty(), "{bad:?} accepted");
        let e = parsed.errors[0].to_string();
        assert!(
            e.starts_with("g.yaml document 1: Gateway infra/gw: field spec.listeners[1].name: ")
                && !e.contains('\n'),
            "{e}"
        );
    }
    let long = "l".repeat(253);
    assert!(parse_file(Path::new("g.yaml"), &gateway(&long))
        .errors
        .is_empty());
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: UDPRoute\n\
                 metadata: {name: dns, namespace: a}\n\
                 spec: {parentRefs: [{name: gw, sectionName: \"udp\\\"x\"}]}\n";
    let e = parse_file(Path::new("r.yaml"), route).errors[0].to_string();
    assert!(
        e.contains("UDPRoute a/dns: field spec.parentRefs[0].sectionName"),
        "{e}"
    );
}

#[test]
fn files_read_on_several_threads_come_back_in_the_order_given_with_their_own_errors() {
    let dir = std::env::temp_dir().join(format!("berth-many-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    // Enough files for several threads; every seventh broken, one missing.
    let paths: Vec<std::path::PathBuf> = (0..100).map(|i| dir.join(format!("{i}.yaml"))).collect();
    for (i, p) in paths.iter().enumerate().filter(|(i, _)| *i != 50) {
        let text = if i % 7 == 0 {
            "kind: [".to_string()
        } else {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                 metadata: {{name: r{i}, namespace: a}}\nspec: {{parentRefs: [{{name: gw}}]}}\n"
            )
        };
        std::fs::write(p, text).expect("write");
    }
    let parsed = super::read_files(&paths);
    assert_eq!(parsed.len(), paths.len());
    for (i, f) in parsed.iter().enumerate() {
        if i % 7 == 0 || i == 50 {
            assert!(
                f.objects.is_empty() && !f.errors.is_empty(),
                "file {i}: {f:?}"
            );
            assert!(
                f.errors[0].to_string().contains(&format!("{i}.yaml")),
                "{:?}",
                f.errors
            );
        } else {
            let [crate::model::Object::Route(r)] = f.objects.as_slice() else {
                panic!("file {i}: {f:?}");
            };
            assert_eq!(r.metadata.name, format!("r{i}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every YAML file of the repository (examples, deployment, golden inputs).
fn repository_yaml() -> Vec<PathBuf> {
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut dirs = vec![
        top.join("examples"),
        top.join("deploy"),
        top.join("gateway-daemon/tests/golden"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                found.push(path);
            }
        }
    }
    assert!(found.len() > 100, "{} YAML files", found.len());
    found
}

#[test]
fn reading_straight_into_types_gives_what_reading_through_values_gives() {
    let mut straight = 0;
    for path in repository_yaml() {
        let text = std::fs::read_to_string(&path).unwrap();
        if let Some(direct) = direct::parse_clean(&path, &text) {
            straight += 1;
            assert_eq!(
                direct,
                parse_through_values(&path, &text),
                "{}",
                path.display()
            );
        }
    }
    assert!(straight > 50, "{straight} files read straight");
}

#[test]
fn documents_read_straight_only_where_values_would_say_nothing_more() {
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n";
    let service = "apiVersion: v1\nkind: Service\n";
    let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n";
    let cases: &[(&str, String)] = &[
        // Read straight.
        ("straight", format!("{route}metadata: {{name: r, namespace: a}}\nspec: {{parentRefs: [{{name: gw, sectionName: tcp}}], rules: [{{name: x, backendRefs: [{{name: s, port: 80}}]}}]}}\nstatus: {{parents: [{{anything: 1}}]}}\n")),
        // Every field `direct.rs` passes without looking (SERVICE_PLAIN, ObjectMeta's):
        // the value path must say nothing of them either.
        ("straight", format!("{service}metadata: {{name: s, namespace: a, annotations: {{a: b}}, resourceVersion: '1', finalizers: [x], generateName: s-, generation: 2, uid: u, selfLink: /x, creationTimestamp: '2026-01-01T00:00:00Z', deletionTimestamp: '2026-01-02T00:00:00Z', deletionGracePeriodSeconds: 30, labels: {{a: b}}}}\nspec: {{type: LoadBalancer, clusterIP: 10.0.0.1, clusterIPs: [10.0.0.1], selector: {{app: a}}, ipFamilies: [IPv4], ipFamilyPolicy: SingleStack, sessionAffinity: None, internalTrafficPolicy: Cluster, externalTrafficPolicy: Local, healthCheckNodePort: 30000, allocateLoadBalancerNodePorts: true, externalIPs: [192.0.2.1], externalName: x.example, loadBalancerClass: c, loadBalancerIP: 192.0.2.2, loadBalancerSourceRanges: [10.0.0.0/8], publishNotReadyAddresses: true, trafficDistribution: PreferClose, ports: [{{name: p, port: 80, targetPort: 8080, protocol: TCP, appProtocol: http, nodePort: 30001}}]}}\n")),
        ("straight", format!("{slice}metadata: {{name: s-1, namespace: a, labels: {{kubernetes.io/service-name: s}}, generateName: s-}}\naddressType: IPv4\nendpoints: [{{addresses: [10.1.0.1], conditions: {{ready: true}}, nodeName: n1, zone: z, hostname: h}}]\nports: [{{name: p, port: 8080, protocol: TCP, appProtocol: http}}]\n")),
        // Another kind or another order: that document through a value, the rest straight.
        ("straight", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {team: a}}\n".to_string()),
        ("straight", format!("kind: TCPRoute\nmetadata: {{name: r, namespace: a}}\napiVersion: gateway.networking.k8s.io/v1\nspec: {{parentRefs: [{{name: gw}}]}}\n---\n{route}metadata: {{name: r2, namespace: a}}\nspec: {{}}\n")),
        ("straight", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: s}, spec: {ports: [{port: 80}]}}\n".to_string()),
        ("straight", "---\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n".to_string()),
        ("straight", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h}\n".to_string()),
        // Through values, the whole file: errors, warnings, fields with fields to check.
        ("values", format!("{route}metadata: {{name: r, namespace: a}}\nspec: {{parentRefs: [{{name: 80}}]}}\n")),
        ("values", format!("{slice}metadata: {{name: s-1, namespace: a, labels: {{version: 1}}}}\naddressType: IPv4\n")),
        ("values", format!("{route}metadata: {{name: r, namespace: a}}\nspec: {{parentRef: [{{name: gw}}]}}\n")),
        ("values", format!("{route}metadata: {{name: R, namespace: a}}\nspec: {{}}\n")),
        ("values", format!("{route}metadata: {{name: r, namespace: a}}\nspec: {{parentRefs: [{{name: gw, sectionName: Tcp}}]}}\n")),
        ("values", format!("{route}metadata: {{name: r, namespace: a, ownerReferences: [{{apiVersion: v1, kind: X, name: x, uid: u, controler: true}}]}}\nspec: {{}}\n")),
        ("values", format!("{slice}metadata: {{name: s-1, namespace: a}}\naddressType: IPv4\nendpoints: [{{addresses: [10.1.0.1], targetRef: {{kind: Pod, nmae: p}}}}]\n")),
        ("values", format!("{service}metadata: {{name: s, namespace: a}}\nspec: {{ports: [{{port: 80}}]}}\nstatus: {{loadBalancer: {{ingres: []}}}}\n")),
        ("values", format!("{service}metadata: {{name: s, namespace: a}}\nspec: {{ports: [{{port: '80'}}]}}\n")),
        ("values", format!("{service}metadata: {{name: s, namespace: a}}\nspec: {{ports: [{{port: 80}}]}}\nspec: {{}}\n")),
        ("values", format!("{route}metadata: {{name: r}}\n---\n{route}metadata: [\n")),
    ];
    for (how, text) in cases {
        let path = Path::new("t.yaml");
        let direct = direct::parse_clean(path, text);
        assert_eq!(direct.is_some(), *how == "straight", "{how}: {text}");
        let reference = parse_through_values(path, text);
        assert_eq!(parse_file(path, text), reference, "{text}");
        if *how == "straight" {
            assert!(
                reference.errors.is_empty() && reference.warnings.is_empty(),
                "{reference:?}"
            );
        } else {
            assert!(
                !reference.errors.is_empty() || !reference.warnings.is_empty(),
                "{text}"
            );
        }
    }
}

#[test]
fn a_file_that_defines_nothing_more_gives_its_place_back_and_others_keep_theirs() {
    let route = |name: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {{name: {name}, namespace: a}}\nspec: {{}}\n"
        )
    };
    let parse = |name: &str, text: &str| parse_file(Path::new(name), text);
    let (a, b) = (
        parse("a.yaml", &route("one")),
        parse("b.yaml", &route("two")),
    );
    let mut d = Definitions::default();
    d.replace(Path::new("a.yaml"), &FileObjects::default(), &a)
        .unwrap();
    d.replace(Path::new("b.yaml"), &FileObjects::default(), &b)
        .unwrap();
    // a.yaml emptied: its index is free, b.yaml's objects still say where they are.
    d.replace(Path::new("a.yaml"), &a, &FileObjects::default())
        .unwrap();
    assert_eq!(d.file_of(&a.objects[0]), None);
    assert_eq!(d.file_of(&b.objects[0]), Some(Path::new("b.yaml")));
    // c.yaml takes the free index; defining b's route again is an error naming b.yaml.
    let c = parse("c.yaml", &format!("{}---\n{}", route("one"), route("two")));
    let errors = d
        .replace(Path::new("c.yaml"), &FileObjects::default(), &c)
        .unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].message.contains("b.yaml document 1"),
        "{errors:?}"
    );
    let c = parse("c.yaml", &route("one"));
    d.replace(Path::new("c.yaml"), &FileObjects::default(), &c)
        .unwrap();
    assert_eq!(d.file_of(&c.objects[0]), Some(Path::new("c.yaml")));
    assert_eq!(d.file_of(&b.objects[0]), Some(Path::new("b.yaml")));
    // Read again as it is, a file keeps its definitions.
    d.replace(Path::new("c.yaml"), &c, &c).unwrap();
    assert_eq!(d.file_of(&c.objects[0]), Some(Path::new("c.yaml")));
}
