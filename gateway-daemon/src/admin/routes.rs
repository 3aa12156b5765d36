//! The rows of `berth get routes` of one namespace or all, as `/api/v1/routes` (JSON)
//! and `/api/v1/tables/routes` (the table) answer them: whole, or written a part at a
//! time as the server sends them.

use std::sync::Arc;

use super::route_row::{rows_of, RouteRow};
use crate::{planner::RouteEntry, publish::Published};

/// The rows of `berth get routes`, of one namespace or all.
pub fn route_rows(p: &Published, namespace: Option<&str>) -> Vec<RouteRow> {
    let mut rows = Vec::new();
    each_route_row(p, namespace, |r| rows.push(r));
    rows
}

/// [`route_rows`] as the JSON array `/api/v1/routes` answers, whole.
pub fn route_rows_json(p: &Published, namespace: Option<&str>) -> String {
    RouteRowParts::new(Arc::new(p.clone()), namespace, RowFormat::Json).whole()
}

/// The table `berth get routes` prints, of one namespace or all, whole.
pub fn route_table_text(p: &Published, namespace: Option<&str>) -> String {
    RouteRowParts::new(Arc::new(p.clone()), namespace, RowFormat::Table).whole()
}

/// How [`RouteRowParts`] writes the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    /// The JSON array `/api/v1/routes` answers.
    Json,
    /// The table `berth get routes` prints (`/api/v1/tables/routes`).
    Table,
}

/// The rows of `berth get routes`, written a part of about [`PART_BYTES`] at a time as
/// the server sends them. At 100k routes they are ~30 MiB of JSON (16 MiB of table):
/// built whole, the answer (and a string doubling its way there) raised the daemon's
/// peak memory by 35 MiB; each row at once in memory once took ~10 times that.
pub struct RouteRowParts {
    p: Arc<Published>,
    format: RowFormat,
    /// The indices in the state's routes still to write, by kind.
    ranges: std::vec::IntoIter<std::ops::Range<usize>>,
    current: std::ops::Range<usize>,
    /// Whether the start (`[`, the table's head) is written, whether a row is, and
    /// whether the end is.
    opened: bool,
    rows: bool,
    closed: bool,
    /// A part ends once it holds this many bytes (the row that passes it included).
    pub(super) part_bytes: usize,
}

/// About how many bytes one part of a streamed answer holds.
pub const PART_BYTES: usize = 64 * 1024;

impl RouteRowParts {
    /// The rows of snapshot `p`, of one namespace or all.
    pub fn new(p: Arc<Published>, namespace: Option<&str>, format: RowFormat) -> Self {
        let ranges = p
            .state
            .as_ref()
            .map(|state| route_ranges(&state.routes, namespace))
            .unwrap_or_default();
        RouteRowParts {
            p,
            format,
            ranges: ranges.into_iter(),
            current: 0..0,
            opened: false,
            rows: false,
            closed: false,
            part_bytes: PART_BYTES,
        }
    }

    /// The next part of the text, none once it is all written.
    pub fn next_part(&mut self) -> Option<Vec<u8>> {
        if self.closed {
            return None;
        }
        let mut out = Vec::with_capacity(self.part_bytes + 1024);
        if !self.opened {
            match self.format {
                RowFormat::Json => out.push(b'['),
                RowFormat::Table => out.extend(crate::output::route_table_head().bytes()),
            }
            self.opened = true;
        }
        let p = &*self.p;
        let mut line = String::new();
        while out.len() < self.part_bytes {
            // The next index, past ranges left empty (a kind without routes in the
            // namespace asked for).
            let next = loop {
                match self.current.next() {
                    Some(i) => break Some(i),
                    None => match self.ranges.next() {
                        Some(range) => self.current = range,
                        None => break None,
                    },
                }
            };
            let (Some(i), Some(state)) = (next, &p.state) else {
                match self.format {
                    RowFormat::Json => out.push(b']'),
                    RowFormat::Table => {
                        out.extend(crate::output::route_table_foot(&p.address_paths).bytes())
                    }
                }
                self.closed = true;
                break;
            };
            rows_of(p, state, &state.routes[i], |r| match self.format {
                RowFormat::Json => {
                    if self.rows {
                        out.push(b',');
                    }
                    self.rows = true;
                    // A row is strings and numbers, written to memory: this cannot fail.
                    let _ = serde_json::to_writer(&mut out, &r);
                }
                RowFormat::Table => {
                    line.clear();
                    crate::output::route_table_row(&mut line, &r);
                    out.extend(line.bytes());
                }
            });
        }
        Some(out)
    }

    /// All the parts, as one text.
    pub(super) fn whole(mut self) -> String {
        let bytes: Vec<u8> = std::iter::from_fn(|| self.next_part()).flatten().collect();
        // Both formats are written as UTF-8 text.
        String::from_utf8(bytes).unwrap_or_default()
    }
}

/// Hands each row of `berth get routes` (of one namespace or all) to `emit`, in order.
fn each_route_row(p: &Published, namespace: Option<&str>, mut emit: impl FnMut(RouteRow)) {
    let Some(state) = &p.state else {
        return;
    };
    for range in route_ranges(&state.routes, namespace) {
        for i in range {
            rows_of(p, state, &state.routes[i], &mut emit);
        }
    }
}

/// The indices of `list`'s routes of one namespace or all, one range per kind.
/// Routes are sorted by kind, namespace and name: a namespace's routes are found by
/// binary search within each kind, so asking for one namespace of many costs its own
/// rows only.
fn route_ranges(
    list: &crate::planner::RouteList,
    namespace: Option<&str>,
) -> Vec<std::ops::Range<usize>> {
    // The first index whose route is not `before` (the list is partitioned by it).
    let first_not = |before: &dyn Fn(&RouteEntry) -> bool| {
        list.binary_search_by(|r| match before(r) {
            true => std::cmp::Ordering::Less,
            false => std::cmp::Ordering::Greater,
        })
        .unwrap_or_else(|i| i)
    };
    let mut ranges = Vec::new();
    let mut at = 0;
    while at < list.len() {
        let kind = list[at].kind;
        let end = first_not(&|r| r.kind <= kind);
        ranges.push(match namespace {
            None => at..end,
            Some(ns) => {
                first_not(&|r| (r.kind, r.namespace.as_str()) < (kind, ns))..first_not(&|r| {
                    (r.kind, r.namespace.as_str()) <= (kind, ns)
                })
            }
        });
        at = end;
    }
    ranges
}
