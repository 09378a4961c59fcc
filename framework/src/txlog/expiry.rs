//! The expiry index: which dedup entries were processed when, oldest first, a row per
//! time rather than a row per entry.
//!
//! Every entry of one batch shares the batch's time, so the entries of a time go together
//! into rows of at most [`IDS_PER_ROW`] IDs, keyed `(partition, processed_at_ms, row)`. A
//! batch of 10,000 events adds 20 rows to the index instead of 10,000 (an insert per
//! event was a quarter of the apply's time: `bench/results/2026-12-06-d.md`).
//!
//! ```text
//!   expiry (p, processed_at_ms, row) -> [len id][len id]…   (len: u32, little-endian)
//!     (0, 1700000000100, 0) -> t1 t2 … t512
//!     (0, 1700000000100, 1) -> t513 …          the last row of a time may have room
//!     (0, 1700000000200, 0) -> …
//! ```
//!
//! Invariants (checked after every test's writes by `testutil::Snapshot::of`):
//! - Each entry of `processed` is in exactly one row, the one of its partition and time;
//!   no row holds an ID that is not an entry of that time.
//! - No row is empty.
//!
//! A write transaction collects its changes to the index in [`Edits`] as it applies changes
//! in order, and writes each row it touched once, at the end ([`Edits::write`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;

use redb::{ReadableTable, Table};

/// IDs in one row at most. A row is rewritten whole when an apply adds to it or removes
/// from it, so it is kept small; 512 IDs of 36 bytes are under 20 KiB. The tests use 4, so
/// that a few entries already fill several rows.
#[cfg(not(test))]
pub(super) const IDS_PER_ROW: usize = 512;
#[cfg(test)]
pub(super) const IDS_PER_ROW: usize = 4;

/// The key of an index row: `(partition, processed_at_ms, row number)`.
type Key = (i32, i64, u32);

/// The index table's type: `(partition, processed_at_ms, row)` -> encoded IDs.
pub(super) type Index<'txn> = Table<'txn, Key, &'static [u8]>;

/// The IDs of a row, encoded.
pub(super) fn encode<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    let mut row = Vec::new();
    for id in ids {
        // An event ID is far shorter than 4 GiB: the engine checks every dedup entry
        // against the changelog's record size.
        let len = u32::try_from(id.len()).unwrap_or(u32::MAX);
        row.extend_from_slice(&len.to_le_bytes());
        row.extend_from_slice(id.as_bytes());
    }
    row
}

/// The IDs of an encoded row; an error if it is not one.
pub(super) fn decode(row: &[u8]) -> Result<Vec<&str>, redb::Error> {
    let corrupt = |what: &str| redb::Error::Corrupted(format!("an expiry index row {what}"));
    let mut ids = Vec::new();
    let mut rest = row;
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(corrupt("ends inside a length"));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(corrupt("ends inside an ID"));
        }
        let (id, tail) = tail.split_at(len);
        ids.push(std::str::from_utf8(id).map_err(|_| corrupt("holds an ID that is not UTF-8"))?);
        rest = tail;
    }
    Ok(ids)
}

/// The changes one write transaction makes to the index, per `(partition, time)`.
#[derive(Default)]
pub(super) struct Edits<'c> {
    times: BTreeMap<(i32, i64), TimeEdits<'c>>,
}

/// The changes to the rows of one `(partition, time)`.
#[derive(Default)]
struct TimeEdits<'c> {
    /// IDs to add, in order; `None` where one was added and then removed again.
    added: Vec<Option<&'c str>>,
    /// Where each ID still to add is in `added`: built by the first removal, since most
    /// transactions remove nothing they added and should not hash every ID for it.
    positions: Option<HashMap<&'c str, usize>>,
    /// IDs to take out of the rows already written.
    removed: HashSet<&'c str>,
}

impl<'c> Edits<'c> {
    /// `id` was processed at `at` in `partition`; it is in no row of that time yet.
    pub(super) fn add(&mut self, partition: i32, at: i64, id: &'c str) {
        let time = self.times.entry((partition, at)).or_default();
        if let Some(positions) = &mut time.positions {
            positions.insert(id, time.added.len());
        }
        time.added.push(Some(id));
    }

    /// `id`, processed at `at` in `partition`, is no longer an entry of that time.
    pub(super) fn remove(&mut self, partition: i32, at: i64, id: &'c str) {
        let TimeEdits {
            added,
            positions,
            removed,
        } = self.times.entry((partition, at)).or_default();
        let positions = positions.get_or_insert_with(|| {
            added
                .iter()
                .enumerate()
                .filter_map(|(position, id)| Some(((*id)?, position)))
                .collect()
        });
        match positions.remove(id) {
            // Added by this transaction: it never reaches a row.
            Some(position) => added[position] = None,
            None => {
                removed.insert(id);
            }
        }
    }

    /// Writes the rows: those with IDs removed are rewritten (or removed when empty), then
    /// the IDs added fill the last row of their time and new rows after it.
    pub(super) fn write(self, index: &mut Index<'_>) -> Result<(), redb::Error> {
        for ((partition, at), time) in self.times {
            if !time.removed.is_empty() {
                remove_from_rows(index, partition, at, &time.removed)?;
            }
            let added: Vec<&str> = time.added.into_iter().flatten().collect();
            if !added.is_empty() {
                append(index, partition, at, &added)?;
            }
        }
        Ok(())
    }
}

/// Takes `removed` out of the rows of `(partition, at)`.
fn remove_from_rows(
    index: &mut Index<'_>,
    partition: i32,
    at: i64,
    removed: &HashSet<&str>,
) -> Result<(), redb::Error> {
    let mut rewrites: Vec<(u32, Option<Vec<u8>>)> = Vec::new();
    for row in index.range(time_rows(partition, at))? {
        let (key, value) = row?;
        let ids = decode(value.value())?;
        let kept: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| !removed.contains(id))
            .collect();
        if kept.len() != ids.len() {
            let number = key.value().2;
            rewrites.push((number, (!kept.is_empty()).then(|| encode(kept))));
        }
    }
    for (number, row) in rewrites {
        match row {
            Some(row) => index.insert((partition, at, number), row.as_slice())?,
            None => index.remove((partition, at, number))?,
        };
    }
    Ok(())
}

/// Adds `ids` to the rows of `(partition, at)`: the last one while it has room, then new
/// ones numbered after it.
fn append(index: &mut Index<'_>, partition: i32, at: i64, ids: &[&str]) -> Result<(), redb::Error> {
    let last = index
        .range(time_rows(partition, at))?
        .next_back()
        .transpose()?
        .map(|(key, value)| (key.value().2, value.value().to_vec()));
    let mut rest = ids;
    let mut next = 0;
    if let Some((number, mut row)) = last {
        let held = decode(&row)?.len();
        let room = IDS_PER_ROW.saturating_sub(held).min(rest.len());
        if room > 0 {
            let (now, later) = rest.split_at(room);
            row.extend_from_slice(&encode(now.iter().copied()));
            index.insert((partition, at, number), row.as_slice())?;
            rest = later;
        }
        next = row_number(number, 1)?;
    }
    for (offset, ids) in rest.chunks(IDS_PER_ROW).enumerate() {
        let number = row_number(next, offset)?;
        index.insert(
            (partition, at, number),
            encode(ids.iter().copied()).as_slice(),
        )?;
    }
    Ok(())
}

/// The row `offset` rows after row `number`.
fn row_number(number: u32, offset: usize) -> Result<u32, redb::Error> {
    u32::try_from(offset)
        .ok()
        .and_then(|offset| number.checked_add(offset))
        .ok_or_else(|| redb::Error::Corrupted("an expiry index time has 2^32 rows".to_owned()))
}

/// The rows of `(partition, at)`, in order.
fn time_rows(partition: i32, at: i64) -> std::ops::RangeInclusive<Key> {
    (partition, at, 0)..=(partition, at, u32::MAX)
}

/// The index rows' bounds for `partition`, oldest first.
pub(super) fn partition_rows(partition: i32) -> (Bound<Key>, Bound<Key>) {
    super::tables::partition_range(partition, |p| (p, i64::MIN, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_decode_to_what_was_encoded_and_a_cut_row_is_an_error() {
        let ids = ["a", "", "évènement-42", &"x".repeat(300)];
        let row = encode(ids.iter().copied());
        assert_eq!(decode(&row).unwrap(), ids);
        assert_eq!(decode(&[]).unwrap(), Vec::<&str>::new());
        // Inside the first length, inside the first ID, inside the second length, inside
        // the last ID.
        for cut in [1, 4, 6, row.len() - 1] {
            assert!(decode(&row[..cut]).is_err(), "cut at {cut}");
        }
        let mut not_utf8 = encode(["ab"]);
        not_utf8[4] = 0xff;
        assert!(decode(&not_utf8).is_err());
    }
}
