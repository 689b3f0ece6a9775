//! `bulldozer._kernels`: the load path's inner loops, compiled ahead of time.
//!
//! * `encode` walks a row layout (the tree `bulldozer.load.encoder.layouts` describes: varint,
//!   fixed, bytes, concatenated and grouped rows) row by row: each row's size, then its bytes
//!   written once into one output buffer;
//! * `decimals` writes decimal128 values as the strings Arrow's cast writes;
//! * `hash_items`, `pair_sums` and `xxh64` compute the order-independent pair digest
//!   (`bulldozer.codec.digest`), with XXH64 from the `xxhash-rust` crate;
//! * `diff_pairs` finds what changed between two sets of pairs (a delta's, `bulldozer.load.delta`);
//! * `absent_fields` counts the records lacking each top-level field (a delta's null counts);
//! * `ImageSet` finds int64 values in a set built once (equality deletes' deleted values).
//!
//! Arrays arrive through the buffer protocol (numpy views of Arrow buffers: no copy) and
//! every index is bounds-checked, so a malformed layout is an error, never a write out of
//! place. The work runs without the GIL, so the client's sender threads go on meanwhile.

mod shared;

use pyo3::buffer::{Element, PyBuffer};
use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

// ---------------------------------------------------------------------------- buffers

/// The Python buffers a call reads or writes, kept alive (and exported) until it returns.
#[derive(Default)]
struct Held {
    u8s: Vec<PyBuffer<u8>>,
    u64s: Vec<PyBuffer<u64>>,
    i64s: Vec<PyBuffer<i64>>,
}

fn check<T: Element>(buf: &PyBuffer<T>, what: &str) -> PyResult<usize> {
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what}: the array must be C-contiguous")));
    }
    Ok(buf.item_count())
}

/// A read-only view of `buf`. The caller keeps `buf` (in a `Held`) for as long as the
/// slice is used: the exporter keeps the memory in place while it is exported.
fn view<T: Element>(buf: &PyBuffer<T>, what: &str) -> PyResult<&'static [T]> {
    let n = check(buf, what)?;
    if n == 0 {
        return Ok(&[]);
    }
    Ok(unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const T, n) })
}

fn view_mut<T: Element>(buf: &PyBuffer<T>, what: &str) -> PyResult<&'static mut [T]> {
    let n = check(buf, what)?;
    if buf.readonly() {
        return Err(PyValueError::new_err(format!("{what}: the array must be writable")));
    }
    if n == 0 {
        return Ok(&mut []);
    }
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr() as *mut T, n) })
}

impl Held {
    fn u8s(&mut self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<&'static [u8]> {
        let buf = PyBuffer::<u8>::get(obj)?;
        let slice = view(&buf, what)?;
        self.u8s.push(buf);
        Ok(slice)
    }

    fn u64s(&mut self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<&'static [u64]> {
        let buf = PyBuffer::<u64>::get(obj)?;
        let slice = view(&buf, what)?;
        self.u64s.push(buf);
        Ok(slice)
    }

    fn u64s_mut(&mut self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<&'static mut [u64]> {
        let buf = PyBuffer::<u64>::get(obj)?;
        let slice = view_mut(&buf, what)?;
        self.u64s.push(buf);
        Ok(slice)
    }

    fn i64s(&mut self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<&'static [i64]> {
        let buf = PyBuffer::<i64>::get(obj)?;
        let slice = view(&buf, what)?;
        self.i64s.push(buf);
        Ok(slice)
    }

    fn i64s_mut(&mut self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<&'static mut [i64]> {
        let buf = PyBuffer::<i64>::get(obj)?;
        let slice = view_mut(&buf, what)?;
        self.i64s.push(buf);
        Ok(slice)
    }
}

fn bad(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// Arrow-style offsets of `n` items into `data`: `n + 1` of them, never decreasing, within `data`.
fn check_offsets(offsets: &[u64], n: usize, data_len: usize, what: &str) -> PyResult<()> {
    if offsets.len() != n + 1 {
        return Err(bad(format!("{what}: {} offsets for {n} items", offsets.len())));
    }
    if offsets.windows(2).any(|w| w[1] < w[0]) || offsets[n] > data_len as u64 {
        return Err(bad(format!("{what}: offsets out of order or past the data")));
    }
    Ok(())
}

// ----------------------------------------------------------------------- wire format

#[inline(always)]
fn varint_size(v: u64) -> u64 {
    (u64::from(64 - (v | 1).leading_zeros()) + 6) / 7
}

#[inline(always)]
fn put_varint(out: &mut [u8], mut p: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        out[p] = (v as u8) | 0x80;
        v >>= 7;
        p += 1;
    }
    out[p] = v as u8;
    p + 1
}

/// `src` at `out[p..]`; the position after it. Rows are written in order, each from its
/// start on, so bytes past the end of `src` may be written with junk that what follows
/// overwrites: short copies are then one fixed-size move instead of a call to memcpy.
#[inline(always)]
fn put(out: &mut [u8], p: usize, src: &[u8]) -> usize {
    let len = src.len();
    if len <= 16 && p + 16 <= out.len() && len > 0 {
        let mut block = [0u8; 16];
        block[..len].copy_from_slice(src);
        out[p..p + 16].copy_from_slice(&block);
    } else {
        out[p..p + len].copy_from_slice(src);
    }
    p + len
}

/// `data[a..b]` at `out[p..]`, reading 16 bytes at once where both buffers have them.
#[inline(always)]
fn put_range(out: &mut [u8], p: usize, data: &[u8], a: usize, b: usize) -> usize {
    let len = b - a;
    if len <= 16 && a + 16 <= data.len() && p + 16 <= out.len() {
        let block: [u8; 16] = data[a..a + 16].try_into().unwrap();
        out[p..p + 16].copy_from_slice(&block);
        p + len
    } else {
        put(out, p, &data[a..b])
    }
}

/// A field's tag (at most 10 bytes), written as one 16-byte move.
#[derive(Clone, Copy)]
struct Tag {
    bytes: [u8; 16],
    len: usize,
}

impl Tag {
    fn new(bytes: &[u8]) -> PyResult<Tag> {
        if bytes.len() > 10 {
            return Err(bad(format!("layout: a prefix of {} bytes (a tag has at most 10)", bytes.len())));
        }
        let mut tag = Tag { bytes: [0; 16], len: bytes.len() };
        tag.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(tag)
    }

    #[inline(always)]
    fn put(&self, out: &mut [u8], p: usize) -> usize {
        if p + 16 <= out.len() {
            out[p..p + 16].copy_from_slice(&self.bytes);
            p + self.len
        } else {
            put(out, p, &self.bytes[..self.len])
        }
    }
}

// ------------------------------------------------------------------------ row layouts

type Keep = Option<&'static [u8]>;

#[inline(always)]
fn kept(keep: Keep, i: usize) -> bool {
    match keep {
        None => true,
        Some(k) => k[i] != 0,
    }
}

/// One node of a row layout (see `bulldozer.load.encoder.layouts` for each kind). A node
/// with `keep` writes nothing for the rows it does not keep, nor do its children.
enum Node {
    /// `prefix + varint(values[i])`
    Varint { keep: Keep, values: &'static [u64], prefix: Tag },
    /// `prefix + raw[i * width..(i + 1) * width]`
    Fixed { keep: Keep, raw: &'static [u8], width: usize, prefix: Tag },
    /// item `i` as it is, or `prefix + varint(len) + item` with a prefix
    Bytes { keep: Keep, offsets: &'static [u64], data: &'static [u8], prefix: Tag },
    /// row `i` of each part in order; with a prefix, length-delimited (the lengths are
    /// kept from the sizing pass for the writing one)
    Concat { keep: Keep, prefix: Option<Tag>, parts: Vec<Node>, lengths: Vec<u64> },
    /// elements `bounds[i]..bounds[i + 1]` of `element`, concatenated
    Grouped { keep: Keep, bounds: &'static [u64], element: Box<Node> },
}

struct Parsed {
    node: Node,
    n: usize,
}

fn parse(obj: &Bound<'_, PyAny>, held: &mut Held, depth: usize) -> PyResult<Parsed> {
    if depth > 200 {
        return Err(bad("layout: nested too deeply".into()));
    }
    let t = obj.cast::<PyTuple>()?;
    let kind: String = t.get_item(0)?.extract()?;
    let n: usize = t.get_item(1)?.extract()?;
    let keep_obj = t.get_item(2)?;
    let keep = if keep_obj.is_none() {
        None
    } else {
        let k = held.u8s(&keep_obj, "layout keep")?;
        if k.len() != n {
            return Err(bad(format!("layout {kind}: {} keep flags for {n} rows", k.len())));
        }
        Some(k)
    };
    let prefix_of = |i: usize| -> PyResult<Tag> { Tag::new(&t.get_item(i)?.extract::<Vec<u8>>()?) };
    let node = match kind.as_str() {
        "v" => {
            let values = held.u64s(&t.get_item(3)?, "layout varints")?;
            if values.len() != n {
                return Err(bad(format!("layout v: {} values for {n} rows", values.len())));
            }
            Node::Varint { keep, values, prefix: prefix_of(4)? }
        }
        "f" => {
            let raw = held.u8s(&t.get_item(3)?, "layout fixed")?;
            let width: usize = t.get_item(4)?.extract()?;
            if raw.len() != n * width {
                return Err(bad(format!("layout f: {} bytes for {n} rows of {width}", raw.len())));
            }
            Node::Fixed { keep, raw, width, prefix: prefix_of(5)? }
        }
        "b" => {
            let offsets = held.u64s(&t.get_item(3)?, "layout offsets")?;
            let data = held.u8s(&t.get_item(4)?, "layout data")?;
            check_offsets(offsets, n, data.len(), "layout b")?;
            Node::Bytes { keep, offsets, data, prefix: prefix_of(5)? }
        }
        "c" => {
            let p = t.get_item(3)?;
            let prefix = if p.is_none() { None } else { Some(Tag::new(&p.extract::<Vec<u8>>()?)?) };
            let mut parts = Vec::new();
            for part in t.get_item(4)?.cast::<PyList>()?.iter() {
                let parsed = parse(&part, held, depth + 1)?;
                if parsed.n != n {
                    return Err(bad(format!("layout c: a part of {} rows in a node of {n}", parsed.n)));
                }
                parts.push(parsed.node);
            }
            Node::Concat { keep, prefix, parts, lengths: Vec::new() }
        }
        "g" => {
            let bounds = held.u64s(&t.get_item(3)?, "layout bounds")?;
            let element = parse(&t.get_item(4)?, held, depth + 1)?;
            check_offsets(bounds, n, element.n, "layout g")?;
            Node::Grouped { keep, bounds, element: Box::new(element.node) }
        }
        other => return Err(bad(format!("layout: unknown node kind {other:?}"))),
    };
    Ok(Parsed { node, n })
}

impl Node {
    /// Adds each row's size in bytes (0 where it is not kept) to `out` (one per row), a
    /// node at a time: the loops over whole columns are simple enough to vectorise.
    /// (Rows a parent does not keep get sizes here too; the parent multiplies them by 0.)
    fn sizes(&mut self, out: &mut [u64]) {
        match self {
            Node::Varint { keep, values, prefix } => {
                let t = prefix.len as u64;
                match keep {
                    None => out.iter_mut().zip(values.iter()).for_each(|(o, v)| *o += t + varint_size(*v)),
                    Some(k) => out
                        .iter_mut()
                        .zip(values.iter().zip(k.iter()))
                        .for_each(|(o, (v, k))| *o += u64::from(*k != 0) * (t + varint_size(*v))),
                }
            }
            Node::Fixed { keep, width, prefix, .. } => {
                let w = (prefix.len + *width) as u64;
                match keep {
                    None => out.iter_mut().for_each(|o| *o += w),
                    Some(k) => out.iter_mut().zip(k.iter()).for_each(|(o, k)| *o += u64::from(*k != 0) * w),
                }
            }
            Node::Bytes { keep, offsets, prefix, .. } => {
                let t = prefix.len as u64;
                let lens = offsets.windows(2).map(|w| w[1] - w[0]);
                let each = |len: u64| if t == 0 { len } else { t + varint_size(len) + len };
                match keep {
                    None => out.iter_mut().zip(lens).for_each(|(o, len)| *o += each(len)),
                    Some(k) => out
                        .iter_mut()
                        .zip(lens.zip(k.iter()))
                        .for_each(|(o, (len, k))| *o += u64::from(*k != 0) * each(len)),
                }
            }
            Node::Concat { keep, prefix, parts, lengths } => {
                let mut own = vec![0u64; out.len()];
                for part in parts.iter_mut() {
                    part.sizes(&mut own);
                }
                let t = prefix.map(|tag| tag.len as u64);
                let flags = keep.map(|k| k.iter().map(|k| u64::from(*k != 0)));
                let whole = |s: u64| match t {
                    None => s,
                    Some(t) => t + varint_size(s) + s,
                };
                match flags {
                    None => out.iter_mut().zip(own.iter()).for_each(|(o, s)| *o += whole(*s)),
                    Some(f) => out.iter_mut().zip(own.iter().zip(f)).for_each(|(o, (s, k))| *o += k * whole(*s)),
                }
                if prefix.is_some() {
                    *lengths = own; // the length headers the writing pass puts before each row
                }
            }
            Node::Grouped { keep, bounds, element } => {
                let mut each = vec![0u64; bounds[bounds.len() - 1] as usize];
                element.sizes(&mut each);
                for (i, o) in out.iter_mut().enumerate() {
                    if kept(*keep, i) {
                        *o += each[bounds[i] as usize..bounds[i + 1] as usize].iter().sum::<u64>();
                    }
                }
            }
        }
    }

    /// Row `i`'s bytes at `out[p..]`; the position after them. Leaves are written inline
    /// (a call per field and row cost more than the field's bytes); inner nodes recurse.
    #[inline(always)]
    fn write(&self, i: usize, out: &mut [u8], mut p: usize) -> usize {
        match self {
            Node::Varint { keep, values, prefix } => {
                if kept(*keep, i) {
                    p = prefix.put(out, p);
                    p = put_varint(out, p, values[i]);
                }
                p
            }
            Node::Fixed { keep, raw, width, prefix } => {
                if kept(*keep, i) {
                    p = prefix.put(out, p);
                    p = put_range(out, p, raw, i * *width, (i + 1) * *width);
                }
                p
            }
            Node::Bytes { keep, offsets, data, prefix } => {
                if kept(*keep, i) {
                    let (a, b) = (offsets[i] as usize, offsets[i + 1] as usize);
                    if prefix.len != 0 {
                        p = prefix.put(out, p);
                        p = put_varint(out, p, (b - a) as u64);
                    }
                    p = put_range(out, p, data, a, b);
                }
                p
            }
            Node::Concat { .. } | Node::Grouped { .. } => self.write_inner(i, out, p),
        }
    }

    #[inline(never)]
    fn write_inner(&self, i: usize, out: &mut [u8], mut p: usize) -> usize {
        match self {
            Node::Concat { keep, prefix, parts, lengths } => {
                if kept(*keep, i) {
                    if let Some(tag) = prefix {
                        p = tag.put(out, p);
                        p = put_varint(out, p, lengths[i]);
                    }
                    for part in parts {
                        p = part.write(i, out, p);
                    }
                }
                p
            }
            Node::Grouped { keep, bounds, element } => {
                if kept(*keep, i) {
                    for j in bounds[i] as usize..bounds[i + 1] as usize {
                        p = element.write(j, out, p);
                    }
                }
                p
            }
            _ => self.write(i, out, p),
        }
    }
}

/// Rows a thread of `write_rows` writes at least.
const ROWS_PER_THREAD: usize = 8192;

/// Writes every row of `root` at its offset in `out` (`offs`: `n + 1` offsets, `out` the
/// bytes of all rows); the first row whose bytes end elsewhere than its offsets say, if any.
/// The rows are split into up to `threads` ranges (0: as many as there are cores) of at
/// least `ROWS_PER_THREAD` rows, written on one thread each into its own part of `out`: a
/// write never reaches past the end of its part (the 16-byte moves of `put` fall back to
/// exact copies there), so no thread writes bytes another one does.
fn write_rows(root: &Node, offs: &[u64], out: &mut [u8], threads: usize) -> Option<usize> {
    let n = offs.len() - 1;
    let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |c| c.get()) } else { threads };
    let parts = threads.min(n / ROWS_PER_THREAD).max(1);
    let range = |first: usize, end: usize, out: &mut [u8]| -> Option<usize> {
        let base = offs[first];
        (first..end).find(|&r| root.write(r, out, (offs[r] - base) as usize) as u64 != offs[r + 1] - base)
    };
    if parts == 1 {
        return range(0, n, out);
    }
    let bounds: Vec<usize> = (0..=parts).map(|k| k * n / parts).collect();
    std::thread::scope(|scope| {
        let mut rest = out;
        let mut handles = Vec::with_capacity(parts - 1);
        for k in (1..parts).rev() {  // cut from the end: the last part first
            let (first, end) = (bounds[k], bounds[k + 1]);
            let len = (offs[end] - offs[first]) as usize;
            let cut = rest.len() - len;
            let (head, tail) = rest.split_at_mut(cut);
            rest = head;
            handles.push(scope.spawn(move || range(first, end, tail)));
        }
        let first = range(0, bounds[1], rest);
        let others = handles.into_iter().map(|h| h.join().expect("an encoder thread panicked"));
        first.into_iter().chain(others.flatten()).min()
    })
}

/// Every row of `layout` (`n` rows): fills `offsets` (uint64, `n + 1`) with where each
/// row starts and returns the bytes, written on up to `threads` threads (0: one per core;
/// see `write_rows`).
#[pyfunction]
#[pyo3(signature = (layout, n, offsets, threads = 0))]
fn encode<'py>(
    py: Python<'py>,
    layout: &Bound<'py, PyAny>,
    n: usize,
    offsets: &Bound<'py, PyAny>,
    threads: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut held = Held::default();
    let Parsed { node: mut root, n: rows } = parse(layout, &mut held, 0)?;
    if rows != n {
        return Err(bad(format!("encode: a layout of {rows} rows, {n} asked for")));
    }
    let offs = held.u64s_mut(offsets, "encode offsets")?;
    if offs.len() != n + 1 {
        return Err(bad(format!("encode: {} offsets for {n} rows", offs.len())));
    }
    let total = py.detach(|| {
        let mut sizes = vec![0u64; n];
        root.sizes(&mut sizes);
        offs[0] = 0;
        for r in 0..n {
            offs[r + 1] = offs[r] + sizes[r];
        }
        offs[n]
    });
    let total = usize::try_from(total).map_err(|_| bad("encode: the batch does not fit in memory".into()))?;
    let mut wrong: Option<usize> = None;
    let offs: &[u64] = offs;
    let bytes = PyBytes::new_with(py, total, |out| {
        wrong = py.detach(|| write_rows(&root, offs, out, threads));
        Ok(())
    })?;
    if let Some(r) = wrong {
        // a layout bug, never bad input
        return Err(PyAssertionError::new_err(format!(
            "encoder: row {r}'s bytes differ from the size laid out for it"
        )));
    }
    Ok(bytes)
}

// ---------------------------------------------------------------------------- decimals

/// Decimal strings of values that fit an int64 (`low`: the low word of each decimal128),
/// plain notation only, as Arrow's cast writes them; `None` if a valid value would need
/// Arrow's scientific form (fewer than `scale - 5` digits, e.g. `5E-7` at scale 7). Fills
/// `offsets` (uint64, `n + 1`); invalid rows come out empty.
#[pyfunction]
fn decimals<'py>(
    py: Python<'py>,
    low: &Bound<'py, PyAny>,
    valid: &Bound<'py, PyAny>,
    scale: u64,
    offsets: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let mut held = Held::default();
    let low = held.i64s(low, "decimals values")?;
    let valid = held.u8s(valid, "decimals validity")?;
    let offs = held.u64s_mut(offsets, "decimals offsets")?;
    let n = low.len();
    if valid.len() != n || offs.len() != n + 1 {
        return Err(bad(format!("decimals: {n} values, {} flags, {} offsets", valid.len(), offs.len())));
    }
    let plain = py.detach(|| {
        offs[0] = 0;
        let mut total = 0u64;
        for i in 0..n {
            if valid[i] != 0 {
                let v = low[i];
                let mut digits = 1u64;
                let mut m = v.unsigned_abs();
                while m >= 10 {
                    m /= 10;
                    digits += 1;
                }
                if digits + 6 < scale + 1 {
                    return false;
                }
                let mut size = if digits > scale { digits } else { scale + 1 }; // an integer digit at least
                if scale > 0 {
                    size += 1;
                }
                if v < 0 {
                    size += 1;
                }
                total += size;
            }
            offs[i + 1] = total;
        }
        true
    });
    if !plain {
        return Ok(None);
    }
    let bytes = PyBytes::new_with(py, offs[n] as usize, |out| {
        py.detach(|| {
            for i in 0..n {
                let start = offs[i] as usize;
                let mut p = offs[i + 1] as usize;
                if p == start {
                    continue;
                }
                let v = low[i];
                let mut mag = v.unsigned_abs();
                let mut written = 0u64;
                loop {
                    // digits from the right, the point after `scale` of them
                    if scale > 0 && written == scale {
                        p -= 1;
                        out[p] = b'.';
                    }
                    p -= 1;
                    out[p] = b'0' + (mag % 10) as u8;
                    mag /= 10;
                    written += 1;
                    if mag == 0 && written > scale {
                        break;
                    }
                }
                if v < 0 {
                    out[start] = b'-';
                }
            }
        });
        Ok(())
    })?;
    Ok(Some(bytes))
}

// ------------------------------------------------------------------------------ digest

#[inline(always)]
fn item<'a>(data: &'a [u8], offsets: &[u64], i: usize) -> &'a [u8] {
    &data[offsets[i] as usize..offsets[i + 1] as usize]
}

/// XXH64 of one byte string.
#[pyfunction]
#[pyo3(signature = (data, seed = 0))]
fn xxh64(data: &Bound<'_, PyAny>, seed: u64) -> PyResult<u64> {
    let mut held = Held::default();
    Ok(xxhash_rust::xxh64::xxh64(held.u8s(data, "xxh64 data")?, seed))
}

/// XXH64 (`seed`) of each item of Arrow-style buffers, into `out` (uint64, one per item).
#[pyfunction]
fn hash_items(
    py: Python<'_>,
    offsets: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
    seed: u64,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let mut held = Held::default();
    let offsets = held.u64s(offsets, "hash offsets")?;
    let data = held.u8s(data, "hash data")?;
    let out = held.u64s_mut(out, "hash output")?;
    check_offsets(offsets, out.len(), data.len(), "hash_items")?;
    py.detach(|| {
        for (i, h) in out.iter_mut().enumerate() {
            *h = xxhash_rust::xxh64::xxh64(item(data, offsets, i), seed);
        }
    });
    Ok(())
}

/// Up to `limit` hash values that occur more than once across `pieces` (uint64 arrays), the
/// smallest first (each as often as it repeats, up to `limit` in all): the duplicate-key
/// check of a load, over every key's hash. The hashes are spread into 2^16 buckets by their
/// top 16 bits (XXH64 values fill them evenly) and each bucket is sorted on its own: a
/// 10 M-key load's check took 0.64-1.0 s through numpy's sort, on the run's critical path.
#[pyfunction]
fn repeated_hashes(py: Python<'_>, pieces: &Bound<'_, PyList>, limit: usize) -> PyResult<Vec<u64>> {
    let mut held = Held::default();
    let mut views = Vec::with_capacity(pieces.len());
    for piece in pieces.iter() {
        views.push(held.u64s(&piece, "hashes")?);
    }
    Ok(py.detach(|| {
        const BITS: u32 = 16;
        let mut starts = vec![0usize; (1 << BITS) + 1];
        for h in views.iter().flat_map(|v| v.iter()) {
            starts[(*h >> (64 - BITS)) as usize + 1] += 1;
        }
        for b in 1..starts.len() {
            starts[b] += starts[b - 1];
        }
        let mut next = starts.clone();
        let mut all = vec![0u64; starts[1 << BITS]];
        for h in views.iter().flat_map(|v| v.iter()) {
            let b = (*h >> (64 - BITS)) as usize;
            all[next[b]] = *h;
            next[b] += 1;
        }
        let mut found = Vec::new();
        for b in 0..(1usize << BITS) {
            let bucket = &mut all[starts[b]..starts[b + 1]];
            bucket.sort_unstable();
            for pair in bucket.windows(2) {
                if pair[0] == pair[1] {
                    if found.len() == limit {
                        return found;
                    }
                    found.push(pair[0]);
                }
            }
        }
        found
    }))
}

// The mixing constants, shared with Python and the Go data plane (proto/bulldozer/kv/v1/shared.yaml).
const C1: u64 = shared::DIGEST_MIX_C1;
const C2: u64 = shared::DIGEST_MIX_C2;
const C3: u64 = shared::DIGEST_MIX_C3;

/// The pair digest's sum over `n` (key, value) pairs and their total bytes; each key's
/// hash goes to `key_hashes` (uint64, `n`). A pair hashes as XXH64 of the key (seed 0) and
/// of the value (`value_seed`) mixed by a splitmix64 finaliser; the sum wraps at 2**64.
#[pyfunction]
fn pair_sums(
    py: Python<'_>,
    key_offsets: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    value_offsets: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    value_seed: u64,
    key_hashes: &Bound<'_, PyAny>,
) -> PyResult<(u64, u64)> {
    let mut held = Held::default();
    let ko = held.u64s(key_offsets, "key offsets")?;
    let k = held.u8s(keys, "keys")?;
    let vo = held.u64s(value_offsets, "value offsets")?;
    let v = held.u8s(values, "values")?;
    let out = held.u64s_mut(key_hashes, "key hashes")?;
    let n = out.len();
    check_offsets(ko, n, k.len(), "pair_sums keys")?;
    check_offsets(vo, n, v.len(), "pair_sums values")?;
    Ok(py.detach(|| {
        let mut total = 0u64;
        for (i, h) in out.iter_mut().enumerate() {
            let hk = xxhash_rust::xxh64::xxh64(item(k, ko, i), 0);
            let hv = xxhash_rust::xxh64::xxh64(item(v, vo, i), value_seed);
            *h = hk;
            let mut x = hk.wrapping_mul(C1).wrapping_add(hv.rotate_left(17)).wrapping_add(C3);
            x = (x ^ (x >> 30)).wrapping_mul(C2);
            x = (x ^ (x >> 27)).wrapping_mul(C3);
            total = total.wrapping_add(x ^ (x >> 31));
        }
        let nbytes = (ko[n] - ko[0]) + (vo[n] - vo[0]);
        (total, nbytes)
    }))
}

// ------------------------------------------------------------------------------- diff

/// One side of a diff in the byte order of its keys: `order[k]` is the index of the `k`-th
/// key, `prefix[k]` its first eight bytes as one number (`prefix8`) and `len[k]` its length,
/// laid out in that order so that the merge compares two keys from these arrays alone,
/// without reading the keys (which sit in file order: the `k`-th key in byte order is
/// anywhere in the data, and reading it there is a cache miss). Only keys longer than
/// eight bytes whose prefixes tie are read whole.
struct KeyOrder {
    order: Vec<usize>,
    prefix: Vec<u64>,
    len: Vec<u64>,
}

impl KeyOrder {
    /// `n` items sorted by their bytes (ties: the earlier first). Sorted by each item's
    /// first eight bytes as one number (`prefix8`) and only items whose first eight bytes tie
    /// compared whole: comparing slices throughout took 31-43 ms for 100 k keys (most of a
    /// 10 M-row delta's diff), this takes about a fifth of that.
    fn of(offsets: &[u64], data: &[u8], n: usize) -> KeyOrder {
        let mut keyed: Vec<(u64, usize)> = (0..n).map(|i| (prefix8(item(data, offsets, i)), i)).collect();
        keyed.sort_unstable(); // by prefix, then index
        let mut order: Vec<usize> = keyed.iter().map(|&(_, i)| i).collect();
        let mut start = 0;
        while start < n {
            let end = start + keyed[start..].iter().take_while(|x| x.0 == keyed[start].0).count();
            if end - start > 1 {
                // a stable sort keeps tied items in index order
                order[start..end].sort_by(|&i, &j| item(data, offsets, i).cmp(item(data, offsets, j)));
            }
            start = end;
        }
        let prefix = keyed.iter().map(|&(p, _)| p).collect(); // a tie's items share their prefix
        let len = order.iter().map(|&i| offsets[i + 1] - offsets[i]).collect();
        KeyOrder { order, prefix, len }
    }

    /// How the `k`-th key of this side compares with the `l`-th of `other` (each side's
    /// offsets and data given). Two keys of at most eight bytes with the same prefix are
    /// the same bytes but for the zeros `prefix8` pads them with: the shorter comes first.
    fn cmp_with(
        &self,
        k: usize,
        (offsets, data): (&[u64], &[u8]),
        other: &KeyOrder,
        l: usize,
        (other_offsets, other_data): (&[u64], &[u8]),
    ) -> std::cmp::Ordering {
        match self.prefix[k].cmp(&other.prefix[l]) {
            std::cmp::Ordering::Equal if self.len[k] <= 8 && other.len[l] <= 8 => self.len[k].cmp(&other.len[l]),
            std::cmp::Ordering::Equal => {
                item(data, offsets, self.order[k]).cmp(item(other_data, other_offsets, other.order[l]))
            }
            decided => decided,
        }
    }

    /// Up to `limit` indices of items equal to the item before them in byte order.
    fn repeats(&self, offsets: &[u64], data: &[u8], limit: usize) -> Vec<u64> {
        (1..self.order.len())
            .filter(|&k| self.cmp_with(k - 1, (offsets, data), self, k, (offsets, data)).is_eq())
            .map(|k| self.order[k] as u64)
            .take(limit)
            .collect()
    }
}

/// The first eight bytes of `s` as a big-endian number, zero-padded: when two items' numbers
/// differ, they order the items as their bytes do (a shorter item padded with zeros is
/// either a prefix of the other or differs from it before the padding).
fn prefix8(s: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let m = s.len().min(8);
    b[..m].copy_from_slice(&s[..m]);
    u64::from_be_bytes(b)
}

/// `NONE` in a merge step: the key is on the other side only.
const NONE: usize = usize::MAX;

/// The keys of both sides merged in byte order, as (index into `old`, index into `new`)
/// pairs, `NONE` for the side that lacks the key; from the sorted sides alone (`KeyOrder`).
fn merged(a: &KeyOrder, old: (&[u64], &[u8]), b: &KeyOrder, new: (&[u64], &[u8])) -> Vec<(usize, usize)> {
    let (n, m) = (a.order.len(), b.order.len());
    let mut steps = Vec::with_capacity(n.max(m));
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        let order = if i == n {
            std::cmp::Ordering::Greater
        } else if j == m {
            std::cmp::Ordering::Less
        } else {
            a.cmp_with(i, old, b, j, new)
        };
        match order {
            std::cmp::Ordering::Less => {
                steps.push((a.order[i], NONE));
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                steps.push((NONE, b.order[j]));
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                steps.push((a.order[i], b.order[j]));
                i += 1;
                j += 1;
            }
        }
    }
    steps
}

/// Whether each old item whose key the new side has too (`steps`' pairs) has the same value
/// there, by old index. Compared in the old side's order, not the keys': a file rewritten
/// keeps its rows in their order, so both sides' values are then read front to back, where
/// in key order each comparison read two values from anywhere (a 10 M-row delta's 70 k
/// pairs of 90-byte values: perf put that comparison at about half of the kernel's time,
/// waiting on memory).
fn same_values(steps: &[(usize, usize)], n_old: usize, old: (&[u64], &[u8]), new: (&[u64], &[u8])) -> Vec<bool> {
    let mut partner = vec![NONE; n_old];
    for &(i, j) in steps {
        if i != NONE && j != NONE {
            partner[i] = j;
        }
    }
    let ((ovo, ov), (nvo, nv)) = (old, new);
    partner.iter().enumerate().map(|(i, &j)| j != NONE && item(ov, ovo, i) == item(nv, nvo, j)).collect()
}

fn u64_bytes<'py>(py: Python<'py>, v: &[u64]) -> Bound<'py, PyBytes> {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    PyBytes::new(py, &raw)
}

/// What changed from the `old` pairs to the `new` ones (a delta's removed and added files'
/// records), by key: the indices into `old` of the keys only it has (deleted), and into
/// `new` of the keys both have with another value (changed) and of those only it has
/// (fresh), and into `old` of the deleted and changed keys together (doomed: what a delta
/// deletes first), each in key order, as uint64 arrays in bytes, with the count of keys both
/// have alike. A side whose keys are not unique makes no diff: then the first three repeated
/// keys' indices of each side come back instead (the diff's arrays empty).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn diff_pairs<'py>(
    py: Python<'py>,
    old_key_offsets: &Bound<'py, PyAny>,
    old_keys: &Bound<'py, PyAny>,
    old_value_offsets: &Bound<'py, PyAny>,
    old_values: &Bound<'py, PyAny>,
    new_key_offsets: &Bound<'py, PyAny>,
    new_keys: &Bound<'py, PyAny>,
    new_value_offsets: &Bound<'py, PyAny>,
    new_values: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let mut held = Held::default();
    let oko = held.u64s(old_key_offsets, "old key offsets")?;
    let ok = held.u8s(old_keys, "old keys")?;
    let ovo = held.u64s(old_value_offsets, "old value offsets")?;
    let ov = held.u8s(old_values, "old values")?;
    let nko = held.u64s(new_key_offsets, "new key offsets")?;
    let nk = held.u8s(new_keys, "new keys")?;
    let nvo = held.u64s(new_value_offsets, "new value offsets")?;
    let nv = held.u8s(new_values, "new values")?;
    let (n_old, n_new) = (oko.len().saturating_sub(1), nko.len().saturating_sub(1));
    check_offsets(oko, n_old, ok.len(), "diff old keys")?;
    check_offsets(ovo, n_old, ov.len(), "diff old values")?;
    check_offsets(nko, n_new, nk.len(), "diff new keys")?;
    check_offsets(nvo, n_new, nv.len(), "diff new values")?;
    let (deleted, changed, fresh, doomed, unchanged, old_repeats, new_repeats) = py.detach(|| {
        let (a, b) = std::thread::scope(|scope| {  // the two sides sorted on two cores
            let old_order = scope.spawn(|| KeyOrder::of(oko, ok, n_old));
            let new_order = KeyOrder::of(nko, nk, n_new);
            (old_order.join().expect("sorting the old keys"), new_order)
        });
        let (old_repeats, new_repeats) = (a.repeats(oko, ok, 3), b.repeats(nko, nk, 3));
        let (mut deleted, mut changed, mut fresh, mut unchanged) = (Vec::new(), Vec::new(), Vec::new(), 0u64);
        let mut doomed = Vec::new();
        if old_repeats.is_empty() && new_repeats.is_empty() {
            let steps = merged(&a, (oko, ok), &b, (nko, nk));
            let same = same_values(&steps, n_old, (ovo, ov), (nvo, nv));
            for (i, j) in steps {
                if j == NONE {
                    deleted.push(i as u64);
                    doomed.push(i as u64);
                } else if i == NONE {
                    fresh.push(j as u64);
                } else if same[i] {
                    unchanged += 1;
                } else {
                    changed.push(j as u64);
                    doomed.push(i as u64);
                }
            }
        }
        (deleted, changed, fresh, doomed, unchanged, old_repeats, new_repeats)
    });
    PyTuple::new(
        py,
        [
            u64_bytes(py, &deleted).into_any(),
            u64_bytes(py, &changed).into_any(),
            u64_bytes(py, &fresh).into_any(),
            u64_bytes(py, &doomed).into_any(),
            unchanged.into_pyobject(py)?.into_any(),
            u64_bytes(py, &old_repeats).into_any(),
            u64_bytes(py, &new_repeats).into_any(),
        ],
    )
}

/// One varint of `data` at `*at` (advanced past it), or None where it runs past the end or
/// over ten bytes.
fn read_varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

/// The top-level field numbers of one protobuf message, each as it is met (None: the bytes
/// are no message: a wire type protobuf 3 does not write, a length past the end).
fn field_numbers(message: &[u8], mut seen: impl FnMut(u64)) -> Option<()> {
    let mut at = 0usize;
    while at < message.len() {
        let tag = read_varint(message, &mut at)?;
        seen(tag >> 3);
        let skip = match tag & 7 {
            0 => {
                read_varint(message, &mut at)?;
                0
            }
            1 => 8,
            2 => usize::try_from(read_varint(message, &mut at)?).ok()?,
            5 => 4,
            _ => return None,
        };
        at = at.checked_add(skip).filter(|end| *end <= message.len())?;
    }
    Some(())
}

/// For each of `numbers` (top-level field numbers), how many of the messages (`offsets` and
/// `data`: an Arrow binary array's) lack it: the records whose column of that field is null
/// (a field with presence is written whenever it is set, a zero or an empty value too).
#[pyfunction]
fn absent_fields(
    py: Python<'_>,
    offsets: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
    numbers: Vec<u64>,
) -> PyResult<Vec<u64>> {
    let mut held = Held::default();
    let offs = held.u64s(offsets, "offsets")?;
    let bytes = held.u8s(data, "data")?;
    let n = offs.len().saturating_sub(1);
    check_offsets(offs, n, bytes.len(), "absent_fields")?;
    let counted = py.detach(|| {
        let mut absent = vec![0u64; numbers.len()];
        let mut present = vec![false; numbers.len()];
        for i in 0..n {
            present.iter_mut().for_each(|p| *p = false);
            field_numbers(item(bytes, offs, i), |number| {
                if let Some(at) = numbers.iter().position(|&wanted| wanted == number) {
                    present[at] = true;
                }
            })
            .ok_or(i)?;
            for (count, &was) in absent.iter_mut().zip(&present) {
                *count += u64::from(!was);
            }
        }
        Ok::<_, usize>(absent)
    });
    counted.map_err(|i| PyValueError::new_err(format!("absent_fields: record {i} is not a protobuf message")))
}

// ----------------------------------------------------------------------- image set

/// A set of distinct int64 values built once, each found by its position among them: the
/// deleted values of an equality delete (`bulldozer.warehouse.equality_deletes`), looked up
/// batch after batch. Arrow's `index_in` hashes its value set again at every call, which at
/// 100 k deleted ids cost 3.2 ms a 65,536-row batch; a lookup here costs a fraction of that.
///
/// Open addressing with linear probing, at most half full; a value's slot starts at its
/// Fibonacci hash (sequential ids spread out), and a slot holds (value, position + 1), so
/// 0 marks an empty one.
#[pyclass(frozen, module = "bulldozer._kernels")]
struct ImageSet {
    slots: Vec<(i64, u64)>,
    shift: u32,
    len: usize,
}

impl ImageSet {
    #[inline(always)]
    fn start(&self, value: i64) -> usize {
        ((value as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The position of `value` among the values the set was built from, or -1.
    #[inline(always)]
    fn position(&self, value: i64) -> i64 {
        let mask = self.slots.len() - 1;
        let mut at = self.start(value);
        loop {
            let (held, position) = self.slots[at];
            if position == 0 {
                return -1;
            }
            if held == value {
                return position as i64 - 1;
            }
            at = (at + 1) & mask;
        }
    }
}

#[pymethods]
impl ImageSet {
    /// The set of `values` (int64, distinct; a value repeated is an error).
    #[new]
    fn new(py: Python<'_>, values: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut held = Held::default();
        let values = held.i64s(values, "image set values")?;
        let built = py.detach(|| {
            let bits = (2 * values.len()).max(8).next_power_of_two().trailing_zeros();
            let mut set = ImageSet { slots: vec![(0, 0); 1usize << bits], shift: 64 - bits, len: values.len() };
            let mask = set.slots.len() - 1;
            for (i, &value) in values.iter().enumerate() {
                let mut at = set.start(value);
                loop {
                    let (held, position) = set.slots[at];
                    if position == 0 {
                        set.slots[at] = (value, i as u64 + 1);
                        break;
                    }
                    if held == value {
                        return Err(i);
                    }
                    at = (at + 1) & mask;
                }
            }
            Ok(set)
        });
        built.map_err(|i| bad(format!("image set: value {i} ({}) is there twice", values[i])))
    }

    /// Each of `wanted`'s (int64) position among the set's values, or -1, into `out` (int64,
    /// as many).
    fn find(&self, py: Python<'_>, wanted: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut held = Held::default();
        let wanted = held.i64s(wanted, "image set lookup")?;
        let out = held.i64s_mut(out, "image set positions")?;
        if wanted.len() != out.len() {
            return Err(bad(format!("image set: {} values to find, {} positions", wanted.len(), out.len())));
        }
        py.detach(|| {
            for (position, &value) in out.iter_mut().zip(wanted) {
                *position = self.position(value);
            }
        });
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.len
    }
}

#[pymodule]
fn _kernels(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add_function(wrap_pyfunction!(decimals, m)?)?;
    m.add_function(wrap_pyfunction!(xxh64, m)?)?;
    m.add_function(wrap_pyfunction!(hash_items, m)?)?;
    m.add_function(wrap_pyfunction!(pair_sums, m)?)?;
    m.add_function(wrap_pyfunction!(diff_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(repeated_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(absent_fields, m)?)?;
    m.add_class::<ImageSet>()?;
    Ok(())
}
