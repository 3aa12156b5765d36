//! Attaching the programs to interfaces: the XDP program on ingress, the TC program on
//! egress (tcx) and the hand-off program on ingress (tcx, after XDP) of every
//! `--interface`, each as a bpf link pinned under `links/` (`xdp@IFINDEX`,
//! `tc@IFINDEX`, `tc-in@IFINDEX`). Pins keep the programs running while no daemon runs;
//! a restarted daemon replaces the program inside each link atomically, so no packet
//! sees no program.
//!
//! An interface that is no `--interface` but where SNAT traffic to a backend leaves (a
//! tunnel, a pod's veth) gets both programs too (`xdp-snat@IFINDEX`, `tc-snat@IFINDEX`),
//! attached and detached as the routes toward the SNAT backends say (`snat.rs`): TC gives
//! the forwarded packets the node's source there, XDP takes the backend's replies to the
//! node's address back. `converge` leaves those alone; listing such an interface later
//! takes its links over (renamed, never detached).
//!
//! Links are matched to interfaces by index, not name: a renamed interface keeps its
//! link (an earlier version matched names, and a renamed interface then failed to
//! attach with a bare "File exists" because its old link still held it).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::{
    links::{FdLink, LinkOrder, PinnedLink},
    tc::{SchedClassifierLink, TcAttachOptions},
    xdp::XdpLink,
    ProgramError, SchedClassifier, TcAttachType, XdpMode,
};

use crate::datapath::{
    xdp, AttachMode, Attached, Datapath, DatapathError, Result, TC_INGRESS_PROGRAM, TC_PROGRAM,
};

/// Which program a link runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkKind {
    /// The XDP program, on ingress.
    Xdp,
    /// The TC program, on egress (tcx).
    Tc,
    /// The hand-off program, on ingress (tcx).
    TcIngress,
}

impl LinkKind {
    pub(in crate::datapath) fn prefix(self) -> &'static str {
        match self {
            LinkKind::Xdp => "xdp",
            LinkKind::Tc => "tc",
            LinkKind::TcIngress => "tc-in",
        }
    }

    /// The TC program of this kind and where it is attached.
    fn tc(self) -> (&'static str, TcAttachType) {
        match self {
            LinkKind::TcIngress => (TC_INGRESS_PROGRAM, TcAttachType::Ingress),
            _ => (TC_PROGRAM, TcAttachType::Egress),
        }
    }
}

/// Why an interface runs the programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkRole {
    /// It is an `--interface`.
    Listed,
    /// SNAT traffic to a backend leaves out of it.
    SnatEgress,
}

impl LinkRole {
    /// What follows the kind in the pin's name.
    pub(in crate::datapath) fn suffix(self) -> &'static str {
        match self {
            LinkRole::Listed => "",
            LinkRole::SnatEgress => "-snat",
        }
    }
}

/// What `converge` changed, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkChange {
    /// A listed interface now runs this program.
    Attached {
        /// Interface name.
        iface: String,
        /// What happened to its XDP link.
        how: Attached,
    },
    /// An interface attached by an earlier run but no longer listed was detached.
    Detached {
        /// Interface index.
        ifindex: u32,
        /// Its name, if it still exists.
        iface: Option<String>,
    },
}

/// A link pinned under `links/`.
#[derive(Debug)]
struct Pin {
    kind: LinkKind,
    role: LinkRole,
    ifindex: u32,
    path: PathBuf,
}

/// The links pinned in `dir`. Names of earlier versions (`NAME@IFINDEX`, XDP only)
/// are read too.
fn pins(dir: &Path) -> Vec<Pin> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Pin> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let (kind, role, ifindex) = crate::datapath::pins::link_name(&name)?;
            Some(Pin {
                kind,
                role,
                ifindex,
                path: entry.path(),
            })
        })
        .collect();
    out.sort_by(|a, b| (a.ifindex, a.kind, &a.path).cmp(&(b.ifindex, b.kind, &b.path)));
    out
}

/// The interfaces (by index) that hold a link pinned in pin directory `pin_dir`, with
/// why (an interface listed and attached for SNAT too, while being taken over, is
/// listed).
pub(in crate::datapath) fn attached(pin_dir: &Path) -> std::collections::BTreeMap<u32, LinkRole> {
    let mut out = std::collections::BTreeMap::new();
    for p in pins(&pin_dir.join("links")) {
        let role = out.entry(p.ifindex).or_insert(p.role);
        *role = (*role).min(p.role);
    }
    out
}

/// The interfaces (by index) whose TC ingress holds the hand-off program (a
/// `tc-in@IFINDEX` link pinned in pin directory `pin_dir`).
pub(in crate::datapath) fn handoff_ingresses(pin_dir: &Path) -> std::collections::BTreeSet<u32> {
    pins(&pin_dir.join("links"))
        .into_iter()
        .filter(|p| p.kind == LinkKind::TcIngress)
        .map(|p| p.ifindex)
        .collect()
}

impl Datapath {
    fn links_dir(&self) -> PathBuf {
        self.pin_dir.join("links")
    }

    fn link_path(&self, kind: LinkKind, role: LinkRole, ifindex: u32) -> PathBuf {
        self.links_dir()
            .join(format!("{}{}@{ifindex}", kind.prefix(), role.suffix()))
    }

    /// Attaches both programs to `iface`: where an earlier run left a pinned link, the
    /// program in it is replaced atomically; otherwise a new link is created and pinned.
    /// Returns what happened to the XDP link. On failure nothing new stays attached.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<Attached> {
        let ifindex = resolve(iface)?;
        self.attach_as(iface, ifindex, LinkRole::Listed, mode)
    }

    /// Attaches both programs to interface `ifindex` (named `iface`), where SNAT traffic
    /// leaves, in the mode the `--interface`s were given.
    pub(in crate::datapath) fn attach_snat_egress(
        &mut self,
        iface: &str,
        ifindex: u32,
    ) -> Result<Attached> {
        self.attach_as(iface, ifindex, LinkRole::SnatEgress, self.host.attach_mode)
    }

    /// Whether this process holds the XDP link attached to interface `ifindex` for SNAT
    /// traffic (with this build's program in it).
    pub(in crate::datapath) fn holds_snat_egress(&self, ifindex: u32) -> bool {
        let path = self.link_path(LinkKind::Xdp, LinkRole::SnatEgress, ifindex);
        self.host.links.contains_key(&path)
    }

    /// Detaches the programs attached to interface `ifindex` for SNAT traffic.
    pub(in crate::datapath) fn detach_snat_egress(&mut self, ifindex: u32) {
        for pin in pins(&self.links_dir()) {
            if pin.ifindex == ifindex && pin.role == LinkRole::SnatEgress {
                self.unpin(&pin.path);
            }
        }
    }

    fn attach_as(
        &mut self,
        iface: &str,
        ifindex: u32,
        role: LinkRole,
        mode: AttachMode,
    ) -> Result<Attached> {
        let mut created = Vec::new();
        let result = self.attach_both(iface, ifindex, role, mode, &mut created);
        if result.is_err() {
            self.unpin_all(&created);
        }
        result
    }

    /// Makes the set of interfaces running Berth exactly `ifaces` (with this build's
    /// programs): interfaces attached by an earlier run and no longer listed are
    /// detached, listed ones attached or updated. All names are resolved before
    /// anything changes; if one attachment fails, the error names the interface and
    /// what this call attached anew is detached again.
    pub fn converge(&mut self, ifaces: &[String], mode: AttachMode) -> Result<Vec<LinkChange>> {
        let wanted: Vec<(String, u32)> = ifaces
            .iter()
            .map(|i| Ok((i.clone(), resolve(i)?)))
            .collect::<Result<_>>()?;
        self.host.attach_mode = mode;
        let mut changes = Vec::new();
        for pin in pins(&self.links_dir()) {
            if pin.role == LinkRole::SnatEgress || wanted.iter().any(|(_, ix)| *ix == pin.ifindex) {
                continue;
            }
            self.unpin(&pin.path);
            let detached = LinkChange::Detached {
                ifindex: pin.ifindex,
                iface: ifname(pin.ifindex),
            };
            if !changes.contains(&detached) {
                changes.push(detached);
            }
        }
        let mut created = Vec::new();
        for (iface, ifindex) in &wanted {
            match self.attach_both(iface, *ifindex, LinkRole::Listed, mode, &mut created) {
                Ok(how) => changes.push(LinkChange::Attached {
                    iface: iface.clone(),
                    how,
                }),
                Err(e) => {
                    self.unpin_all(&created);
                    return Err(e);
                }
            }
        }
        Ok(changes)
    }

    /// Detaches both programs from `iface` and removes their pins.
    pub fn detach(&mut self, iface: &str) -> Result<()> {
        let ifindex = resolve(iface)?;
        for pin in pins(&self.links_dir()) {
            if pin.ifindex == ifindex {
                self.unpin(&pin.path);
            }
        }
        Ok(())
    }

    fn attach_both(
        &mut self,
        iface: &str,
        ifindex: u32,
        role: LinkRole,
        mode: AttachMode,
        created: &mut Vec<PathBuf>,
    ) -> Result<Attached> {
        let xdp_path = self.link_path(LinkKind::Xdp, role, ifindex);
        let how = self.attach_xdp(iface, ifindex, &xdp_path, mode)?;
        if matches!(how, Attached::New(_)) {
            created.push(xdp_path);
        }
        for kind in [LinkKind::Tc, LinkKind::TcIngress] {
            let tc_path = self.link_path(kind, role, ifindex);
            if self.attach_tc(iface, ifindex, kind, &tc_path)? {
                created.push(tc_path);
            }
        }
        Ok(how)
    }

    /// Moves a link of `kind` on `ifindex` pinned under another name (an earlier
    /// version's `NAME@IFINDEX`, or the other role's) to `path`, so that the program
    /// in it is replaced rather than a second one attached beside it.
    fn adopt_pin(&mut self, kind: LinkKind, ifindex: u32, path: &Path) {
        for pin in pins(&self.links_dir()) {
            if pin.kind == kind && pin.ifindex == ifindex && pin.path != path {
                if path.exists() {
                    self.unpin(&pin.path);
                } else if fs::rename(&pin.path, path).is_ok() {
                    if let Some(link) = self.host.links.remove(&pin.path) {
                        self.host.links.insert(path.to_path_buf(), link);
                    }
                }
            }
        }
    }

    fn attach_xdp(
        &mut self,
        iface: &str,
        ifindex: u32,
        path: &Path,
        mode: AttachMode,
    ) -> Result<Attached> {
        let path = path.to_path_buf();
        self.adopt_pin(LinkKind::Xdp, ifindex, &path);
        let attach_err = |source| attach_error(iface, "XDP", source);
        let link_err = |message: String| DatapathError::Link {
            path: path.clone(),
            message,
        };
        let replaced = self.replace_pinned(&path, iface, |ebpf, fd| {
            let program = xdp(ebpf, crate::datapath::PROGRAM).map_err(|e| e.to_string())?;
            let link = XdpLink::try_from(fd).map_err(|e| e.to_string())?;
            let id = program.attach_to_link(link).map_err(|e| e.to_string())?;
            let link = program.take_link(id).map_err(|e| e.to_string())?;
            FdLink::try_from(link).map_err(|e| e.to_string())
        });
        if replaced {
            let mode = match crate::netlink::xdp_attached(ifindex) {
                Ok(crate::netlink::XDP_ATTACHED_DRV) => Some(AttachMode::Native),
                Ok(crate::netlink::XDP_ATTACHED_SKB) => Some(AttachMode::Skb),
                _ => None,
            };
            return Ok(Attached::Replaced(mode));
        }
        let program = xdp(&mut self.ebpf, crate::datapath::PROGRAM)?;
        let attempts: &[(AttachMode, XdpMode)] = match mode {
            AttachMode::Auto => &[
                (AttachMode::Native, XdpMode::Driver),
                (AttachMode::Skb, XdpMode::Skb),
            ],
            AttachMode::Native => &[(AttachMode::Native, XdpMode::Driver)],
            AttachMode::Skb => &[(AttachMode::Skb, XdpMode::Skb)],
        };
        let mut last = None;
        for &(used, xdp_mode) in attempts {
            match program.attach(iface, xdp_mode) {
                Ok(id) => {
                    let link = program.take_link(id).map_err(attach_err)?;
                    let fd = FdLink::try_from(link).map_err(|e| link_err(e.to_string()))?;
                    let pinned = fd.pin(&path).map_err(|e| link_err(e.to_string()))?;
                    self.host.links.insert(path, FdLink::from(pinned));
                    // Native refused: said, with why (generic mode costs more per packet).
                    if let Some(e) = last.take() {
                        let why = native_refusal(iface, e);
                        tracing::warn!(
                            iface,
                            reason = %crate::error_chain(&why),
                            "native XDP refused; attached in generic (skb) mode"
                        );
                    }
                    return Ok(Attached::New(used));
                }
                Err(e) if used == AttachMode::Native => last = Some(e),
                Err(e) => return Err(attach_err(e)),
            }
        }
        Err(match last {
            Some(e) => native_refusal(iface, e),
            None => attach_err(ProgramError::UnknownInterface {
                name: iface.to_string(),
            }),
        })
    }

    /// Attaches the TC program of `kind` to `iface` (egress or ingress); true if a new
    /// link was made.
    fn attach_tc(
        &mut self,
        iface: &str,
        ifindex: u32,
        kind: LinkKind,
        path: &Path,
    ) -> Result<bool> {
        let path = path.to_path_buf();
        let (name, direction) = kind.tc();
        self.adopt_pin(kind, ifindex, &path);
        let what = match direction {
            TcAttachType::Ingress => "TC ingress",
            _ => "TC egress",
        };
        let attach_err = |source| attach_error(iface, what, source);
        let link_err = |message: String| DatapathError::Link {
            path: path.clone(),
            message,
        };
        let replaced = self.replace_pinned(&path, iface, |ebpf, fd| {
            let program = classifier(ebpf, name).map_err(|e| e.to_string())?;
            let link = SchedClassifierLink::try_from(fd).map_err(|e| e.to_string())?;
            let id = program.attach_to_link(link).map_err(|e| e.to_string())?;
            let link = program.take_link(id).map_err(|e| e.to_string())?;
            FdLink::try_from(link).map_err(|e| e.to_string())
        });
        if replaced {
            return Ok(false);
        }
        let program = classifier(&mut self.ebpf, name)?;
        let id = program
            .attach_with_options(
                iface,
                direction,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(attach_err)?;
        let link = program.take_link(id).map_err(attach_err)?;
        let fd = FdLink::try_from(link).map_err(|e| link_err(e.to_string()))?;
        let pinned = fd.pin(&path).map_err(|e| link_err(e.to_string()))?;
        self.host.links.insert(path, FdLink::from(pinned));
        Ok(true)
    }

    /// Puts this build's program into the link an earlier run pinned at `path`
    /// (atomically, by `update`); false if there is none, or if it is unusable (its
    /// interface went away): then it is unpinned and the caller attaches anew.
    fn replace_pinned(
        &mut self,
        path: &Path,
        iface: &str,
        update: impl FnOnce(&mut aya::Ebpf, FdLink) -> std::result::Result<FdLink, String>,
    ) -> bool {
        if !path.exists() {
            return false;
        }
        let replaced = PinnedLink::from_pin(path)
            .map_err(|e| e.to_string())
            .and_then(|p| update(&mut self.ebpf, FdLink::from(p)));
        match replaced {
            Ok(fd) => {
                self.host.links.insert(path.to_path_buf(), fd);
                true
            }
            Err(e) => {
                tracing::warn!(iface, pin = %path.display(), error = e, "pinned link unusable; attaching anew");
                self.unpin(path);
                false
            }
        }
    }

    /// Removes a pin and drops this process's handle: the link, held by nothing else,
    /// detaches its program.
    fn unpin(&mut self, path: &Path) {
        let _ = fs::remove_file(path);
        self.host.links.remove(path);
    }

    fn unpin_all(&mut self, paths: &[PathBuf]) {
        for p in paths {
            self.unpin(p);
        }
    }
}

/// The loaded TC program.
pub(in crate::datapath) fn tc_program(ebpf: &mut aya::Ebpf) -> Result<&mut SchedClassifier> {
    classifier(ebpf, TC_PROGRAM)
}

/// The TC program `name` of the object.
pub(in crate::datapath) fn classifier<'a>(
    ebpf: &'a mut aya::Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .ok_or(DatapathError::Program {
            name,
            source: ProgramError::UnexpectedProgramType,
        })?
        .try_into()
        .map_err(|source| DatapathError::Program { name, source })
}

/// The index of interface `iface`, or an error naming it.
fn resolve(iface: &str) -> Result<u32> {
    crate::datapath::ifindex(iface).ok_or_else(|| DatapathError::NoInterface {
        iface: iface.to_string(),
    })
}

impl Datapath {
    /// The `--interface`s the gateway program is attached to (by pinned link), as
    /// (index, name) of those that exist.
    pub(in crate::datapath) fn attached_interfaces(&self) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = pins(&self.links_dir())
            .into_iter()
            .filter(|p| p.kind == LinkKind::Xdp && p.role == LinkRole::Listed)
            .filter_map(|p| Some((p.ifindex, ifname(p.ifindex)?)))
            .collect();
        out.dedup();
        out
    }
}

/// The name of interface `ifindex`, if it exists.
fn ifname(ifindex: u32) -> Option<String> {
    crate::sys::iface::index_to_name(ifindex)
}

/// An attach error, made specific when another program already holds the hook.
/// Why native XDP refused `iface`: its MTU when the driver said so (`ERANGE`), else as
/// `attach_error` says.
fn native_refusal(iface: &str, source: ProgramError) -> DatapathError {
    if !errno_in(&source, libc::ERANGE) {
        return attach_error(iface, "XDP", source);
    }
    let mtu = crate::sys::iface::mtu(iface).map_or_else(|| "?".into(), |m| m.to_string());
    DatapathError::XdpMtu {
        iface: iface.to_string(),
        mtu,
        source: Box::new(source),
    }
}

fn attach_error(iface: &str, what: &'static str, source: ProgramError) -> DatapathError {
    if errno_in(&source, libc::EEXIST) || errno_in(&source, libc::EBUSY) {
        return DatapathError::Occupied {
            iface: iface.to_string(),
            what,
        };
    }
    DatapathError::Attach {
        iface: iface.to_string(),
        what,
        source,
    }
}

/// Whether an `io::Error` with `errno` is somewhere in `e`'s chain.
fn errno_in(e: &(dyn std::error::Error + 'static), errno: i32) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if io.raw_os_error() == Some(errno) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}
