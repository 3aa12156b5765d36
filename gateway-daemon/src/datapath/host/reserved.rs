//! The installed services' ports, reserved from the host's ephemeral ports
//! (`net.ipv4.ip_local_reserved_ports`), so that no local connection takes one as its
//! source port.

use crate::datapath::Datapath;

impl Datapath {
    /// Ports of the installed services.
    pub(in crate::datapath) fn installed_ports(&self) -> crate::host::PortSet {
        self.keys.ports()
    }

    /// Whether the reserved ports differ from the installed services' ports.
    pub(in crate::datapath) fn reserved_ports_stale(&self) -> bool {
        self.host.reserved != self.installed_ports()
    }

    /// Reserves the installed services' ports from the host's ephemeral ports (and
    /// releases those no longer installed), leaving the operator's entries alone.
    pub(in crate::datapath) fn sync_reserved_ports(&mut self) {
        let want = self.installed_ports();
        let release = self.host.reserved.minus(&want);
        match crate::host::update_reserved_ports(&release, &want) {
            Ok(()) => self.host.reserved = want,
            Err(e) => tracing::warn!(error = %e, "updating net.ipv4.ip_local_reserved_ports"),
        }
    }
}
