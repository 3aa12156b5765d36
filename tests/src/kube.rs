//! A real Kubernetes control plane for one test, as envtest starts one: etcd on a
//! temporary directory, kube-apiserver (self-signed serving certificate, RBAC,
//! service-account tokens, an audit log of the requests Berth's ServiceAccount makes)
//! and kube-controller-manager (the EndpointSlice controller, and the ServiceAccount
//! controllers pods need), all inside a network namespace of the test's own: the API
//! server listens on that namespace's 127.0.0.1, so nothing leaves it. The binaries are
//! the ones `cargo xtask setup` builds into `target/kube/bin` at the versions in
//! `kube-toolchain` (or `$KUBEBUILDER_ASSETS`). Every process is killed by PID and every
//! file removed on drop, also when the test fails.
//!
//! The test talks to the API server through `ControlPlane::block_on`, which runs a future
//! on a thread inside the namespace with a client holding the admin certificate.

use std::{
    fs::File,
    future::Future,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    discovery::{self, Scope},
    Api, Client, Config,
};
use serde_json::Value;

use crate::netns::{Netns, Proc};

/// The API server's port inside the namespace.
pub const API_PORT: u16 = 6443;
/// Where the test's and Berth's clients reach the API server.
pub const SERVER: &str = "https://127.0.0.1:6443";
/// The user Berth's ServiceAccount token authenticates as.
pub const BERTH_USER: &str = "system:serviceaccount:berth-system:berth";
/// The field manager of everything the test applies.
pub const TEST_MANAGER: &str = "berth-test";

/// One control plane at a time per test binary: each takes a few hundred MB and most of
/// a core while it starts, and these machines have two.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A process of the control plane and how it was started.
struct Started {
    proc: Proc,
    program: PathBuf,
    args: Vec<String>,
    /// Its stdout and stderr.
    log: PathBuf,
}

/// A running control plane; stopped and removed on drop.
pub struct ControlPlane {
    /// The namespace everything runs in (and where Berth runs too).
    pub ns: Netns,
    /// Certificates, keys, kubeconfigs, etcd's data, logs.
    pub dir: PathBuf,
    /// etcd, kube-apiserver, kube-controller-manager (stopped in reverse).
    procs: Vec<Started>,
    _turn: MutexGuard<'static, ()>,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            p.proc.kill();
        }
        if std::thread::panicking() {
            eprintln!(
                "control plane files (logs, audit) were in {}; removed",
                self.dir.display()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory of the binaries; panics saying how to build them.
pub fn assets() -> PathBuf {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kube/bin"));
    for b in ["etcd", "kube-apiserver", "kube-controller-manager"] {
        assert!(
            dir.join(b).exists(),
            "{} is missing: `cargo xtask setup` builds Kubernetes' binaries (kube-toolchain) \
             into target/kube/bin",
            dir.join(b).display()
        );
    }
    dir
}

/// `openssl ARGS` in `dir` (`args` split at whitespace: file names are relative to
/// `dir`, subjects and extensions hold no spaces); panics with its output if it fails.
fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args.split_whitespace())
        .output()
        .unwrap_or_else(|e| panic!("running openssl {args}: {e}"));
    assert!(
        out.status.success(),
        "openssl {args} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A new P-256 key, unencrypted (for `openssl req`).
const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

/// A key `name.key` and a certificate `name.crt` for `subject`, signed by the CA in
/// `dir`, with the extensions `ext` (`-addext` values).
fn leaf(dir: &Path, name: &str, subject: &str, ext: &[&str]) {
    let ext: String = ext.iter().map(|e| format!(" -addext {e}")).collect();
    openssl(
        dir,
        &format!("req -new {NEW_KEY} -keyout {name}.key -out {name}.csr -subj {subject}{ext}"),
    );
    openssl(
        dir,
        &format!(
            "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
             -copy_extensions copy -out {name}.crt"
        ),
    );
}

/// Makes the command's process die (SIGKILL) when the thread that started it ends, so
/// that a test process killed before its cleanup leaves no control plane running.
fn die_with_test(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// A kubeconfig for `SERVER` with `user` (the YAML of a kubeconfig `user:` map).
pub fn kubeconfig(dir: &Path, name: &str, user: &str) -> PathBuf {
    let path = dir.join(format!("{name}.kubeconfig"));
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {SERVER}
    certificate-authority: {ca}
users:
- name: {name}
  user: {user}
contexts:
- name: test
  context: {{cluster: test, user: {name}}}
current-context: test
",
        ca = dir.join("ca.crt").display()
    );
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// A client certificate kubeconfig user map for `name` in `dir`.
fn cert_user(dir: &Path, name: &str) -> String {
    format!(
        "{{client-certificate: {}, client-key: {}}}",
        dir.join(format!("{name}.crt")).display(),
        dir.join(format!("{name}.key")).display()
    )
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager in a new namespace
    /// `berth-<tag>...` and waits until the API server is ready.
    pub fn start(tag: &str) -> ControlPlane {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let bin = assets();
        let ns = Netns::new(tag);
        let dir = std::env::temp_dir().join(format!("{}-kube", ns.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("control plane directory");
        let mut cp = ControlPlane {
            ns,
            dir,
            procs: Vec::new(),
            _turn: turn,
        };
        let started = Instant::now();
        cp.write_credentials();
        let d = cp.dir.clone();
        let path = |f: &str| d.join(f).display().to_string();

        cp.spawn(
            &bin.join("etcd"),
            &[
                "--data-dir",
                &path("etcd"),
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                // A test's data need not survive a crash of the machine (as envtest).
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        );
        cp.spawn(
            &bin.join("kube-apiserver"),
            &[
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                &format!("--secure-port={API_PORT}"),
                &format!("--cert-dir={}", path("apiserver-certs")),
                &format!("--tls-cert-file={}", path("serving.crt")),
                &format!("--tls-private-key-file={}", path("serving.key")),
                &format!("--client-ca-file={}", path("ca.crt")),
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                &format!("--service-account-key-file={}", path("sa.pub")),
                &format!("--service-account-signing-key-file={}", path("sa.key")),
                // Both families: dual-stack Services, as a dual-stack cluster has them.
                "--service-cluster-ip-range=10.96.0.0/24,fd00:96::/112",
                &format!("--audit-policy-file={}", path("audit-policy.yaml")),
                &format!("--audit-log-path={}", path("audit.log")),
            ],
        );
        cp.wait_ready(started);
        let kcm = path("kcm.kubeconfig");
        cp.spawn(
            &bin.join("kube-controller-manager"),
            &[
                &format!("--kubeconfig={kcm}"),
                &format!("--authentication-kubeconfig={kcm}"),
                &format!("--authorization-kubeconfig={kcm}"),
                // EndpointSlices from Services and Pods; the default ServiceAccount
                // every namespace needs before a Pod can be created; tokens for the
                // controllers' own ServiceAccounts (as kubeadm runs it).
                "--controllers=endpointslice,serviceaccount,serviceaccount-token",
                "--use-service-account-credentials=true",
                &format!("--service-account-private-key-file={}", path("sa.key")),
                &format!("--root-ca-file={}", path("ca.crt")),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=10257",
            ],
        );
        eprintln!(
            "control plane in {} ready after {:.1}s",
            cp.ns.name,
            started.elapsed().as_secs_f64()
        );
        cp
    }

    /// The CA, the API server's serving certificate, the admin's and the controller
    /// manager's client certificates, the service-account signing key, kubeconfigs,
    /// and the audit policy (Berth's ServiceAccount's requests, at metadata level).
    fn write_credentials(&self) {
        let d = &self.dir;
        openssl(
            d,
            &format!(
                "req -x509 {NEW_KEY} -keyout ca.key -out ca.crt -days 2 -subj /CN=berth-test-ca"
            ),
        );
        let leaf_ext = |usage| {
            [
                "basicConstraints=critical,CA:FALSE",
                "keyUsage=critical,digitalSignature",
                usage,
            ]
        };
        let mut serving = leaf_ext("extendedKeyUsage=serverAuth").to_vec();
        serving.push("subjectAltName=IP:127.0.0.1,DNS:localhost");
        leaf(d, "serving", "/CN=kube-apiserver", &serving);
        let client = leaf_ext("extendedKeyUsage=clientAuth");
        leaf(d, "admin", "/O=system:masters/CN=berth-test-admin", &client);
        leaf(d, "kcm", "/CN=system:kube-controller-manager", &client);
        openssl(
            d,
            "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out sa.key",
        );
        openssl(d, "pkey -in sa.key -pubout -out sa.pub");
        kubeconfig(d, "admin", &cert_user(d, "admin"));
        kubeconfig(d, "kcm", &cert_user(d, "kcm"));
        std::fs::write(
            d.join("audit-policy.yaml"),
            format!(
                "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [\"{BERTH_USER}\"]
- level: None
"
            ),
        )
        .expect("audit policy");
    }

    /// Starts `program` inside the namespace, its output in `<name>.log`.
    fn spawn(&mut self, program: &Path, args: &[&str]) {
        let name = program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log = self.dir.join(format!("{name}.log"));
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let proc = self.launch(program, &args, &log);
        self.procs.push(Started {
            proc,
            program: program.to_path_buf(),
            args,
            log,
        });
    }

    /// Starts `program` with `args` in the namespace, appending its output to `log`.
    fn launch(&self, program: &Path, args: &[String], log: &Path) -> Proc {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let err = out.try_clone().expect("log file");
        let child = die_with_test(&mut self.ns.command(program))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        Proc::from_child(child, &program.display().to_string())
    }

    /// Kills kube-apiserver (SIGKILL, as a crash), starts it again with the same
    /// arguments, and waits until it is ready.
    pub fn restart_apiserver(&mut self) {
        self.restart_apiserver_with(&[]);
    }

    /// `restart_apiserver`, with `extra` arguments added (kept for later restarts).
    pub fn restart_apiserver_with(&mut self, extra: &[&str]) {
        let i = self
            .procs
            .iter()
            .position(|p| p.program.ends_with("kube-apiserver"))
            .expect("kube-apiserver was started");
        self.procs[i].proc.kill();
        self.procs[i]
            .args
            .extend(extra.iter().map(|a| a.to_string()));
        let p = &self.procs[i];
        let proc = self.launch(&p.program, &p.args, &p.log);
        self.procs[i].proc = proc;
        self.wait_ready(Instant::now());
    }

    /// Panics (with the end of its log) if a control-plane process has exited.
    pub fn assert_running(&mut self) {
        for p in &mut self.procs {
            if p.proc.exited() {
                panic!(
                    "{} exited; the end of its log:\n{}",
                    p.log.display(),
                    tail(&p.log, 30)
                );
            }
        }
    }

    /// Waits up to 120 s for the API server's `/readyz` (a loaded machine took over 60 s once).
    fn wait_ready(&mut self, started: Instant) {
        let deadline = started + Duration::from_secs(120);
        let d = self.dir.clone();
        let file = |f: &str| d.join(f).display().to_string();
        loop {
            self.assert_running();
            let out = self.ns.try_exec(&[
                "curl",
                "-s",
                "--max-time",
                "5",
                "-w",
                "\nHTTP %{http_code}",
                "--cacert",
                &file("ca.crt"),
                "--cert",
                &file("admin.crt"),
                "--key",
                &file("admin.key"),
                &format!("{SERVER}/readyz?verbose"),
            ]);
            let last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if last.ends_with("HTTP 200") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready after 120 s; its last /readyz?verbose:\n{last}\n\
                 the end of its log:\n{}\nthe end of etcd's log:\n{}",
                tail(&d.join("kube-apiserver.log"), 30),
                tail(&d.join("etcd.log"), 10)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The admin's kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// Runs `f` with an admin client on a thread inside the namespace (where the API
    /// server is reachable), on a runtime of that thread alone.
    pub fn block_on<R: Send, F: Future<Output = R>>(
        &self,
        f: impl FnOnce(Client) -> F + Send,
    ) -> R {
        let kubeconfig = self.admin_kubeconfig();
        self.ns.enter(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let client = client_from(&kubeconfig).await;
                f(client).await
            })
        })
    }

    /// The audit log's events (the requests of Berth's ServiceAccount).
    pub fn audit(&self) -> Vec<serde_json::Value> {
        let path = self.dir.join("audit.log");
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("an audit event is JSON"))
            .collect()
    }
}

/// A client from the kubeconfig at `path`.
pub async fn client_from(path: &Path) -> Client {
    let kc = Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Client::try_from(config).expect("a client")
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Applies every document of a multi-document YAML text by server-side apply, as
/// `kubectl apply --server-side` does; a kind whose CRD is not yet established is
/// retried for up to 30 s.
pub async fn apply_yaml(client: &Client, text: &str) {
    apply_yaml_with(client, text, |_| {}).await
}

/// `apply_yaml`, each document changed by `edit` before it is applied.
pub async fn apply_yaml_with(client: &Client, text: &str, mut edit: impl FnMut(&mut Value)) {
    for de in serde_yaml::Deserializer::from_str(text) {
        let mut value: Value = serde::Deserialize::deserialize(de).expect("a YAML document");
        if value.is_null() {
            continue;
        }
        edit(&mut value);
        apply(client, value).await;
    }
}

/// Applies the files at `paths` (see `apply_yaml`).
pub async fn apply_files(client: &Client, paths: &[PathBuf]) {
    for path in paths {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        apply_yaml(client, &text).await;
    }
}

/// The API of `api_version`/`kind`, in `namespace` if the kind is namespaced.
pub async fn api_for(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> Result<(Api<DynamicObject>, ApiResource), kube::Error> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = discovery::pinned_kind(client, &gvk).await?;
    let api = match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    };
    Ok((api, resource))
}

/// Object `name` of `api_version`/`kind` (in `namespace` if namespaced), as JSON; the
/// error says which object could not be read.
pub async fn get_json(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<Value, String> {
    let what = format!(
        "{kind} {}{name}",
        namespace.map(|n| format!("{n}/")).unwrap_or_default()
    );
    let (api, _) = api_for(client, api_version, kind, namespace)
        .await
        .map_err(|e| format!("the API of {what}: {e}"))?;
    let object = api.get(name).await.map_err(|e| format!("{what}: {e}"))?;
    Ok(serde_json::to_value(object).expect("an object is JSON"))
}

/// The objects of `api_version`/`kind` (in `namespace` if namespaced), as JSON.
pub async fn list_json(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> Result<Vec<Value>, String> {
    let (api, _) = api_for(client, api_version, kind, namespace)
        .await
        .map_err(|e| format!("the API of {kind}: {e}"))?;
    let list = api
        .list(&Default::default())
        .await
        .map_err(|e| format!("listing {kind}: {e}"))?;
    Ok(list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("an object is JSON"))
        .collect())
}

/// Deletes object `name` of `api_version`/`kind` (in `namespace` if namespaced).
pub async fn delete(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) {
    let (api, _) = api_for(client, api_version, kind, namespace)
        .await
        .unwrap_or_else(|e| panic!("the API of {kind}: {e}"));
    api.delete(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {kind} {name}: {e}"));
}

/// Applies one object (see `apply_yaml`).
pub async fn apply(client: &Client, value: Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(value.clone()).expect("an object");
    let types = obj.types.clone().expect("apiVersion and kind");
    let name = obj.metadata.name.clone().expect("a name");
    let what = format!("{} {name}", types.kind);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let result = async {
            let (api, _) = api_for(
                client,
                &types.api_version,
                &types.kind,
                obj.metadata.namespace.as_deref(),
            )
            .await?;
            api.patch(
                &name,
                &PatchParams::apply(TEST_MANAGER).force(),
                &Patch::Apply(&value),
            )
            .await
        }
        .await;
        match result {
            Ok(o) => return o,
            Err(e) if Instant::now() >= deadline => panic!("applying {what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Polls `f` every 200 ms until it returns `Ok` or `timeout` passes; then panics with
/// `what` and the last error.
pub async fn eventually<T, F: Future<Output = Result<T, String>>>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("{what}: still not so after {timeout:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `berth run --kubernetes` inside the control plane's namespace, as the DaemonSet runs
/// it: with a kubeconfig holding its ServiceAccount's token (TokenRequest API), so the
/// RBAC of `deploy/rbac.yaml` decides what it may do; its XDP program on a veth of the
/// namespace, pinned in a fresh directory. Killed by PID, pins and files removed on drop.
pub struct Berth {
    proc: Proc,
    /// What it logged (stderr).
    pub log: PathBuf,
    pins: PathBuf,
    /// Its node name: its identity in the Lease.
    pub node: String,
    /// Its admin endpoint.
    admin: String,
}

impl Berth {
    /// Stops (SIGSTOP) or continues (SIGCONT) the daemon: a process frozen for a while
    /// (a paused VM, a long GC stop), whose connections the API server meanwhile drops.
    pub fn freeze(&mut self, frozen: bool) {
        let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: a signal to the daemon this test started, by its PID.
        let rc = unsafe { libc::kill(self.proc.pid() as i32, signal) };
        assert_eq!(
            rc,
            0,
            "signal {signal} to berth: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Kills the daemon with SIGKILL, as a node that dies: nothing is handed over.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// The endpoints its datapath sends new flows to, per service (read from its
    /// pinned Maglev tables): a backend kept for existing flows only (weight 0) is in
    /// no table.
    pub fn tables(
        &self,
    ) -> std::collections::BTreeMap<
        berth::datapath::ServiceAddr,
        std::collections::BTreeSet<std::net::SocketAddr>,
    > {
        let tables = berth::datapath::pinned_tables(&self.pins).unwrap_or_default();
        tables
            .into_iter()
            .map(|(service, slots)| (service, slots.into_iter().collect()))
            .collect()
    }
}

impl Drop for Berth {
    fn drop(&mut self) {
        self.proc.kill();
        if std::thread::panicking() {
            eprintln!("the end of berth's log:\n{}", tail(&self.log, 40));
        }
        let _ = berth::datapath::remove_pins(&self.pins);
    }
}

/// The node name Berth runs as (its identity in the Lease), and of the Node the
/// test's pods are bound to.
pub const NODE: &str = "berth-test-node";

impl ControlPlane {
    /// A token for the ServiceAccount `berth-system/berth` (which must exist) from the
    /// TokenRequest API, in a kubeconfig.
    pub fn berth_kubeconfig(&self) -> PathBuf {
        let token = self.block_on(|client| async move {
            use k8s_openapi::api::{
                authentication::v1::{TokenRequest, TokenRequestSpec},
                core::v1::ServiceAccount,
            };
            let sas: Api<ServiceAccount> = Api::namespaced(client, "berth-system");
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let answer = sas
                .create_token_request("berth", &Default::default(), &request)
                .await
                .unwrap_or_else(|e| panic!("TokenRequest for berth-system/berth: {e}"));
            answer
                .status
                .and_then(|s| s.token)
                .expect("a token in the TokenRequest's answer")
        });
        kubeconfig(&self.dir, "berth", &format!("{{token: {token}}}"))
    }

    /// Starts `berth run --kubernetes` (see `Berth`) and waits until its admin endpoint
    /// answers.
    pub fn start_berth(&mut self) -> Berth {
        self.start_berth_on(0)
    }

    /// `start_berth` as node `n` of the cluster would run it: node 0 is `NODE` (whose
    /// pods the test binds), node n > 0 is `NODE-n`, with its own veth, pins, state,
    /// log and admin port (all nodes share the namespace, as they share the API server).
    pub fn start_berth_on(&mut self, n: u16) -> Berth {
        let kubeconfig = self.berth_kubeconfig();
        let (gw, peer) = (format!("kgw{}", 2 * n), format!("kgw{}", 2 * n + 1));
        if !self.ns.has_link(&gw) {
            self.ns
                .ip(&["link", "add", &gw, "type", "veth", "peer", "name", &peer]);
            self.ns.ip(&["link", "set", &gw, "up"]);
            self.ns.ip(&["link", "set", &peer, "up"]);
        }
        let suffix = if n == 0 {
            String::new()
        } else {
            format!("-{n}")
        };
        let node = format!("{NODE}{suffix}");
        let admin = format!("127.0.0.1:{}", 9470 + n);
        let log = self.dir.join(format!("berth{suffix}.log"));
        let pins = PathBuf::from(format!("/sys/fs/bpf/berth-test-{}{suffix}", self.ns.name));
        let out = File::create(&log).expect("berth log");
        let child = die_with_test(&mut self.ns.command(&crate::daemon::berth_binary()))
            .args([
                "run",
                "--kubernetes",
                "--interface",
                &gw,
                "--node-name",
                &node,
            ])
            .args(["--admin-addr", &admin])
            .arg("--state-dir")
            .arg(self.dir.join(format!("berth-state{suffix}")))
            .arg("--pin-dir")
            .arg(&pins)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", "berth-system")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start berth run --kubernetes");
        let mut b = Berth {
            proc: Proc::from_child(child, "berth run --kubernetes"),
            log,
            pins,
            node,
            admin,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.berth_routes(&mut b).is_none() {
            assert!(
                Instant::now() < deadline,
                "berth run --kubernetes did not serve its admin endpoint in 30 s; its log:\n{}",
                tail(&b.log, 30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        b
    }

    /// `berth get routes -o json` from the daemon (None while it does not answer);
    /// panics with its log if it exited.
    pub fn berth_routes(&mut self, b: &mut Berth) -> Option<Vec<berth::admin::RouteRow>> {
        self.assert_running();
        if b.proc.exited() {
            panic!(
                "berth run --kubernetes exited; its log:\n{}",
                tail(&b.log, 40)
            );
        }
        crate::daemon::routes_at(&self.ns, &crate::daemon::berth_binary(), &b.admin)
    }
}

/// The controller name of Berth's GatewayClass (`deploy/gatewayclass.yaml`).
pub const CONTROLLER: &str = "berth.dev/gateway-controller";

/// The repository's root; the upstream texts are in `../shared` beside it.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What a user installs: the upstream Gateway API v1.6.1 CRDs (from `../shared`, never
/// copied here), then `deploy/`'s namespace, CRDs, ServiceAccount, RBAC and GatewayClass
/// `berth` (not the DaemonSet: the test runs berth).
pub async fn install(client: &Client) {
    let upstream = repo().join("../shared/gateway-api/v1.6.1/crds");
    let mut crds: Vec<PathBuf> = std::fs::read_dir(&upstream)
        .unwrap_or_else(|e| {
            panic!(
                "upstream CRDs at {} (shared/ beside the repository): {e}",
                upstream.display()
            )
        })
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    crds.sort();
    apply_files(client, &crds).await;
    let deploy = repo().join("deploy");
    let files = [
        "namespace.yaml",
        "crds.yaml",
        "serviceaccount.yaml",
        "rbac.yaml",
        "gatewayclass.yaml",
    ];
    apply_files(client, &files.map(|f| deploy.join(f))).await;
}

/// Our entry in a route's `status.parents`, if any.
pub fn our_parent(route: &Value) -> Option<&Value> {
    route["status"]["parents"]
        .as_array()?
        .iter()
        .find(|p| p["controllerName"] == CONTROLLER)
}

/// The condition of type `kind` in `entry["conditions"]` (a status or a status entry).
pub fn condition<'a>(entry: &'a Value, kind: &str) -> Option<&'a Value> {
    entry["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}
