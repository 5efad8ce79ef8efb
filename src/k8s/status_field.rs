//! The `status` field of an object, serialised alone.
//!
//! A status write only keeps the incoming status (the status subresource ignores the rest),
//! so the in-memory API serialises just that field instead of the whole object: for a host,
//! metadata and spec are most of the bytes, and status writes are most of a simulated day's
//! writes. Kubernetes kinds serialise as structs (k8s-openapi's and kube's derived impls);
//! anything else reports [`StatusField::Unsupported`] and the caller serialises the whole
//! object.

use serde::Serialize;
use serde::ser::{self, Impossible};

/// What [`status_of`] found.
#[derive(Debug)]
pub enum StatusField {
    /// The object serialised as a struct; its `status` field, if it wrote one.
    Found(Option<Vec<u8>>),
    /// Not a struct at the top level: serialise the whole object instead.
    Unsupported,
}

/// The serialised (JSON) `status` field of `obj`, without serialising any other field.
pub fn status_of<T: Serialize>(obj: &T) -> Result<StatusField, serde_json::Error> {
    match obj.serialize(TopLevel) {
        Ok(status) => Ok(StatusField::Found(status)),
        Err(Error::NotAStruct) => Ok(StatusField::Unsupported),
        Err(Error::Json(e)) => Err(e),
    }
}

#[derive(Debug)]
enum Error {
    NotAStruct,
    Json(serde_json::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NotAStruct => f.write_str("not a struct"),
            Error::Json(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<M: std::fmt::Display>(msg: M) -> Self {
        Error::Json(<serde_json::Error as ser::Error>::custom(msg))
    }
}

/// Accepts a struct and nothing else.
struct TopLevel;

/// The fields of the top-level struct, keeping `status` only.
struct Fields {
    status: Option<Vec<u8>>,
}

impl ser::SerializeStruct for Fields {
    type Ok = Option<Vec<u8>>;
    type Error = Error;

    fn serialize_field<V: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &V,
    ) -> Result<(), Error> {
        if key == "status" {
            // Bytes, not a `Value`: a tree of maps costs more to build, and the one reader
            // that wants a tree (the in-memory API's JSON path) is the rare one.
            let v = serde_json::to_vec(value).map_err(Error::Json)?;
            self.status = Some(v);
        }
        Ok(())
    }

    fn end(self) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.status)
    }
}

macro_rules! not_a_struct {
    ($($name:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $name(self, $(_: $arg),*) -> Result<Option<Vec<u8>>, Error> {
            Err(Error::NotAStruct)
        })*
    };
}

impl ser::Serializer for TopLevel {
    type Ok = Option<Vec<u8>>;
    type Error = Error;
    type SerializeSeq = Impossible<Option<Vec<u8>>, Error>;
    type SerializeTuple = Impossible<Option<Vec<u8>>, Error>;
    type SerializeTupleStruct = Impossible<Option<Vec<u8>>, Error>;
    type SerializeTupleVariant = Impossible<Option<Vec<u8>>, Error>;
    type SerializeMap = Impossible<Option<Vec<u8>>, Error>;
    type SerializeStruct = Fields;
    type SerializeStructVariant = Impossible<Option<Vec<u8>>, Error>;

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Fields, Error> {
        Ok(Fields { status: None })
    }

    not_a_struct!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_some<V: ?Sized + Serialize>(self, _: &V) -> Result<Option<Vec<u8>>, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_newtype_struct<V: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &V,
    ) -> Result<Option<Vec<u8>>, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_newtype_variant<V: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<Option<Vec<u8>>, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(Error::NotAStruct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, NodeStatus};
    use serde_json::{Value, json};

    fn tree(bytes: Option<Vec<u8>>) -> Option<Value> {
        bytes.map(|b| serde_json::from_slice(&b).expect("the field is JSON"))
    }

    /// The field alone equals the field of the whole serialised object, for a CRD kind, a
    /// k8s-openapi kind, and with no status at all.
    #[test]
    fn status_alone_matches_the_whole_objects_status() {
        let host: crate::api::host::SSHHost = serde_json::from_value(json!({
            "apiVersion": "karpenter.dklesev.github.io/v1beta1", "kind": "SSHHost",
            "metadata": {"name": "h1", "labels": {"a": "b"}},
            "spec": {"address": "10.0.0.1", "port": 22, "user": "root",
                     "sshKeySecretRef": {"name": "k"}, "capacity": {"cpu": "4"}},
            "status": {"state": "Available", "observedArch": "amd64"}
        }))
        .expect("host");
        let whole = serde_json::to_value(&host).expect("whole");
        let StatusField::Found(alone) = status_of(&host).expect("status") else {
            panic!("SSHHost serialises as a struct");
        };
        let alone = tree(alone);
        assert_eq!(alone.as_ref(), whole.get("status"));
        assert!(alone.is_some());

        let mut node = Node::default();
        let StatusField::Found(none) = status_of(&node).expect("status") else {
            panic!("Node serialises as a struct");
        };
        assert_eq!(
            tree(none).as_ref(),
            serde_json::to_value(&node).expect("v").get("status")
        );
        node.status = Some(NodeStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let StatusField::Found(some) = status_of(&node).expect("status") else {
            panic!("Node serialises as a struct");
        };
        assert_eq!(tree(some), Some(json!({"phase": "Running"})));
    }

    #[test]
    fn anything_but_a_struct_is_unsupported() {
        assert!(matches!(
            status_of(&json!({"status": 1})).expect("map"),
            StatusField::Unsupported
        ));
        assert!(matches!(
            status_of(&3u8).expect("int"),
            StatusField::Unsupported
        ));
    }
}
