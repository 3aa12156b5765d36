//! Reading a pinned datapath without loading it: what several nodes must agree on.

use std::{collections::BTreeMap, net::SocketAddr, path::Path};

use aya::maps::{Array, HashMap, Map, MapData};
use gateway_common::{map_names, Backend, MaglevTable, Service, ServiceKey};

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
    let maglev: Array<MapData, MaglevTable> = Array::try_from(Map::Array(open(map_names::MAGLEV)?))
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
        if svc.active != 0 {
            let ids = maglev
                .get(&svc.table, 0)
                .map_err(map_err(map_names::MAGLEV))?;
            for id in ids {
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
