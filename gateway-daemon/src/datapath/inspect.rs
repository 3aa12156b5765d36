//! Reading a pinned datapath without loading it: what several nodes must agree on.

use std::{collections::BTreeMap, net::SocketAddr, path::Path};

use aya::maps::{Array, HashMap, Map, MapData};
use gateway_common::{map_names, Backend, Service, ServiceKey};

use super::{
    family::{endpoint_of, Addr6, MapAddr},
    map_err, Result, ServiceAddr,
};

/// Every service's Maglev table in the maps pinned in `pin_dir`, each slot resolved to
/// its backend's endpoint: what decides where a flow goes. Backend ids are a node's
/// own (handed out as objects arrive), so tables are compared by endpoint; a service
/// with no backend taking new flows has an empty table.
pub fn pinned_tables(pin_dir: &Path) -> Result<BTreeMap<ServiceAddr, Vec<SocketAddr>>> {
    let open = |name: &'static str| MapData::from_pin(pin_dir.join(name)).map_err(map_err(name));
    let maglev: Array<MapData, u32> = Array::try_from(Map::Array(open(map_names::MAGLEV)?))
        .map_err(map_err(map_names::MAGLEV))?;
    let backends: Array<MapData, Backend> = Array::try_from(Map::Array(open(map_names::BACKENDS)?))
        .map_err(map_err(map_names::BACKENDS))?;
    let backends6: Array<MapData, Addr6> = Array::try_from(Map::Array(open(map_names::BACKENDS6)?))
        .map_err(map_err(map_names::BACKENDS6))?;
    let endpoint = |id: u32, v6: bool| -> Result<SocketAddr> {
        let b = backends.get(&id, 0).map_err(map_err(map_names::BACKENDS))?;
        Ok(if v6 {
            let addr = backends6
                .get(&id, 0)
                .map_err(map_err(map_names::BACKENDS6))?;
            endpoint_of(addr, b.port)
        } else {
            endpoint_of(b.addr, b.port)
        })
    };
    let mut out = BTreeMap::new();
    let services = services::<u32>(open(map_names::SERVICES)?, map_names::SERVICES)?
        .into_iter()
        .chain(services::<Addr6>(
            open(map_names::SERVICES6)?,
            map_names::SERVICES6,
        )?);
    for (key, svc) in services {
        let mut table = Vec::new();
        {
            // The service's region of the pool.
            let start = Service::table_start(svc.table);
            for i in start..start.saturating_add(Service::table_size(svc.table)) {
                let id = maglev.get(&i, 0).map_err(map_err(map_names::MAGLEV))?;
                table.push(endpoint(id, key.addr.is_ipv6())?);
            }
        }
        out.insert(key, table);
    }
    Ok(out)
}

/// The services of one family's pinned service map.
fn services<A: MapAddr>(data: MapData, name: &'static str) -> Result<Vec<(ServiceAddr, Service)>> {
    let map: HashMap<MapData, ServiceKey<A>, Service> =
        HashMap::try_from(Map::HashMap(data)).map_err(map_err(name))?;
    super::load::adopt_services(&map, name)
}

/// The kernel memory the maps pinned in `pin_dir` take, by map name, in bytes: the
/// kernel's own accounting (the `memlock:` line of each map's fdinfo). Maps not pinned
/// there are left out.
pub fn pinned_memory(pin_dir: &Path) -> Result<BTreeMap<&'static str, u64>> {
    use std::os::fd::AsFd as _;
    let mut out = BTreeMap::new();
    for name in map_names::ALL {
        let path = pin_dir.join(name);
        if !path.exists() {
            continue;
        }
        let data = MapData::from_pin(&path).map_err(map_err(name))?;
        let bytes = crate::sys::bpf::map_memlock(data.fd().as_fd()).map_err(|io_error| {
            map_err(name)(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "fdinfo",
                io_error,
            }))
        })?;
        out.insert(name, bytes);
    }
    Ok(out)
}
