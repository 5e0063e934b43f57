//! The pgoutput logical decoding messages (protocol version 1) a walsender sends
//! inside XLogData: Begin, Commit, Relation, Insert, Update, Delete, Truncate, and the
//! Type and Origin messages, which carry nothing a document needs.

use bytes::{Buf, BytesMut};

/// A column of a tuple as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datum {
    Null,
    /// A TOASTed value the update did not change: not sent.
    Unchanged,
    Text(String),
}

/// A relation (table) as described before its first change in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub schema: String,
    pub table: String,
    /// (name, type OID) in column order.
    pub columns: Vec<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `final_lsn`: where the commit record starts.
    Begin {
        final_lsn: u64,
    },
    /// `end_lsn`: just past the commit record (what a slot confirms).
    Commit {
        end_lsn: u64,
    },
    Relation(Relation),
    Insert {
        relation: u32,
        new: Vec<Datum>,
    },
    /// `old`: the old key (its key changed) or the whole old row (`REPLICA IDENTITY FULL`).
    Update {
        relation: u32,
        old: Option<Vec<Datum>>,
        new: Vec<Datum>,
    },
    /// `old`: the key columns (others null), or the whole old row under FULL.
    Delete {
        relation: u32,
        old: Vec<Datum>,
    },
    Truncate {
        relations: Vec<u32>,
    },
    /// Type, Origin, logical messages.
    Other,
}

/// A message that is not pgoutput as we know it.
#[derive(Debug)]
pub struct Malformed(pub String);

pub fn decode(mut b: BytesMut) -> Result<Message, Malformed> {
    let need = |b: &BytesMut, n: usize| {
        if b.remaining() < n {
            Err(Malformed(format!(
                "a message cut short ({} bytes left, {n} needed)",
                b.remaining()
            )))
        } else {
            Ok(())
        }
    };
    need(&b, 1)?;
    let tag = b.get_u8();
    Ok(match tag {
        b'B' => {
            need(&b, 8)?;
            Message::Begin {
                final_lsn: b.get_u64(),
            }
        }
        b'C' => {
            need(&b, 17)?;
            b.advance(1 + 8); // flags, the commit record's LSN
            Message::Commit {
                end_lsn: b.get_u64(),
            }
        }
        b'R' => {
            need(&b, 4)?;
            let id = b.get_u32();
            let schema = cstr(&mut b)?;
            let table = cstr(&mut b)?;
            need(&b, 3)?;
            b.advance(1); // replica identity
            let n = b.get_u16();
            let mut columns = Vec::with_capacity(n as usize);
            for _ in 0..n {
                need(&b, 1)?;
                b.advance(1); // flags
                let name = cstr(&mut b)?;
                need(&b, 8)?;
                let oid = b.get_u32();
                b.advance(4); // typmod
                columns.push((name, oid));
            }
            Message::Relation(Relation {
                id,
                schema,
                table,
                columns,
            })
        }
        b'I' => {
            need(&b, 5)?;
            let relation = b.get_u32();
            b.advance(1); // 'N'
            Message::Insert {
                relation,
                new: tuple(&mut b)?,
            }
        }
        b'U' => {
            need(&b, 5)?;
            let relation = b.get_u32();
            let mut old = None;
            let mut kind = b.get_u8();
            if kind == b'K' || kind == b'O' {
                old = Some(tuple(&mut b)?);
                need(&b, 1)?;
                kind = b.get_u8();
            }
            if kind != b'N' {
                return Err(Malformed(format!(
                    "an update without a new tuple ({:?})",
                    kind as char
                )));
            }
            Message::Update {
                relation,
                old,
                new: tuple(&mut b)?,
            }
        }
        b'D' => {
            need(&b, 5)?;
            let relation = b.get_u32();
            b.advance(1); // 'K' or 'O'
            Message::Delete {
                relation,
                old: tuple(&mut b)?,
            }
        }
        b'T' => {
            need(&b, 5)?;
            let n = b.get_u32();
            b.advance(1); // options
            need(&b, 4 * n as usize)?;
            Message::Truncate {
                relations: (0..n).map(|_| b.get_u32()).collect(),
            }
        }
        _ => Message::Other,
    })
}

fn cstr(b: &mut BytesMut) -> Result<String, Malformed> {
    let end = b
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| Malformed("a name without its terminating zero".into()))?;
    let text = String::from_utf8_lossy(&b[..end]).into_owned();
    b.advance(end + 1);
    Ok(text)
}

fn tuple(b: &mut BytesMut) -> Result<Vec<Datum>, Malformed> {
    if b.remaining() < 2 {
        return Err(Malformed("a tuple cut short".into()));
    }
    let n = b.get_u16();
    (0..n)
        .map(|_| {
            if !b.has_remaining() {
                return Err(Malformed("a tuple cut short".into()));
            }
            match b.get_u8() {
                b'n' => Ok(Datum::Null),
                b'u' => Ok(Datum::Unchanged),
                b't' => {
                    if b.remaining() < 4 {
                        return Err(Malformed("a value cut short".into()));
                    }
                    let len = b.get_u32() as usize;
                    if b.remaining() < len {
                        return Err(Malformed("a value cut short".into()));
                    }
                    let value = b.split_to(len);
                    Ok(Datum::Text(String::from_utf8_lossy(&value).into_owned()))
                }
                other => Err(Malformed(format!("a column of kind {:?}", other as char))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    #[test]
    fn an_update_with_its_old_key_decodes_both_tuples() {
        let mut b = BytesMut::new();
        b.put_u8(b'U');
        b.put_u32(7);
        b.put_u8(b'K');
        b.put_u16(2);
        b.put_u8(b't');
        b.put_u32(1);
        b.put_slice(b"1");
        b.put_u8(b'n');
        b.put_u8(b'N');
        b.put_u16(2);
        b.put_u8(b't');
        b.put_u32(1);
        b.put_slice(b"2");
        b.put_u8(b'u');
        assert_eq!(
            decode(b).unwrap(),
            Message::Update {
                relation: 7,
                old: Some(vec![Datum::Text("1".into()), Datum::Null]),
                new: vec![Datum::Text("2".into()), Datum::Unchanged],
            }
        );
    }
}
