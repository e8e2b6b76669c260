//! The macro that turns the field table ([`super::fields`]) into the code every station reads
//! it through, so that a field is written down once.
//!
//! Each entry of the table is `name: RustType = kind(rule)`, under the `layout` it was added
//! in, with its doc comment and serde attributes:
//!
//! - `required(rule)`: a request field the measurement cannot do without; `rule` is a function
//!   of the field's undecoded value ([`super::rules`]); absent, it rejects the measurement as
//!   `missing <name>`, invalid as `invalid <name>`.
//! - `optional(rule)`: a request field dropped alone when its rule finds it invalid (listed in
//!   `dropped_fields`, counted by name); `rule` may name the fields before it (`part_of(&lcp_ms,
//!   …)` sees `lcp_ms` as judged).
//! - `derived(expr)`: a column the collector sets; `expr` may name the context (the name after
//!   `judged with`) and any field before it.
//! - In the section `sent without a column since layout N`, a request field that has no
//!   column of its own (`server_timing`, `dimensions`): judged first, dropped alone when
//!   invalid, as `optional`; derived columns read it by name, as a [`super::Field`].
//! - `settled(rule)`: a request field whose column the site stage sets ([`super::site`]; the
//!   `sample_rate`, [`crate::sampling`]): judged as `optional`; [`super::Judged`] holds the
//!   valid value sent, if any, and the site stage gives the column its value.
//! - `site()`: a column only the site stage sets ([`super::site::SiteColumns`]): absent from
//!   the judgement (its slot in [`super::Judged`] is `()`).
//!
//! From that the macro makes: [`super::Measurement`] (the row, also its JSON form through
//! serde), [`super::Judged`] (what [`super::judge`] makes of one object, before any site) and
//! `Judged::into_row`, [`super::RawBeacon`] and its setter (the request fields a body's
//! object is read into), [`super::FIELDS`] and [`super::COLUMNS`] (names, kinds, layouts,
//! rejections), `Measurement::columns` (the ClickHouse types, which the schema test checks
//! the DDL against), the RowBinary encoder and decoders, and [`super::judge`] (one object's
//! validation, field by field in table order).

/// Whether fields of a kind are read from the request body.
macro_rules! is_request {
    (required) => {
        true
    };
    (optional) => {
        true
    };
    (settled) => {
        true
    };
    (derived) => {
        false
    };
    (site) => {
        false
    };
}

/// The [`super::FieldKind`] of a kind keyword.
macro_rules! field_kind {
    (required) => {
        $crate::measurement::FieldKind::Required
    };
    (optional) => {
        $crate::measurement::FieldKind::Optional
    };
    (settled) => {
        $crate::measurement::FieldKind::Optional
    };
    (derived) => {
        $crate::measurement::FieldKind::Derived
    };
    (site) => {
        $crate::measurement::FieldKind::Derived
    };
}

/// One field's judgment in `judge`: binds the field's name to its value (a required field's
/// value, an optional field's [`super::rules::Field`], a derived column's value), so that the
/// rules of later fields can name it.
macro_rules! judge_field {
    (required, $name:ident, $raw:ident, $dropped:ident, $withheld:ident, $($rule:tt)*) => {
        let $name = match ($($rule)*)($raw.$name) {
            $crate::measurement::Field::Valid(v) => v,
            $crate::measurement::Field::Absent => {
                return Err(concat!("missing ", stringify!($name)))
            }
            _ => return Err(concat!("invalid ", stringify!($name))),
        };
    };
    (settled, $name:ident, $raw:ident, $dropped:ident, $withheld:ident, $($rule:tt)*) => {
        judge_field!(optional, $name, $raw, $dropped, $withheld, $($rule)*);
    };
    (site, $name:ident, $raw:ident, $dropped:ident, $withheld:ident,) => {
        let $name = ();
    };
    (optional, $name:ident, $raw:ident, $dropped:ident, $withheld:ident, $($rule:tt)*) => {
        let $name = ($($rule)*)($raw.$name);
        match &$name {
            $crate::measurement::Field::Invalid => $dropped.push(stringify!($name)),
            $crate::measurement::Field::Withheld(_) => $withheld = true,
            _ => {}
        }
    };
    (derived, $name:ident, $raw:ident, $dropped:ident, $withheld:ident, $($rule:tt)*) => {
        let $name = { $($rule)* };
    };
}

/// A judged field as [`super::Judged`] holds it: an optional or settled field's value if it
/// is stored, any other as it is.
macro_rules! to_judged {
    (optional, $value:expr) => {
        $value.stored()
    };
    (settled, $value:expr) => {
        $value.stored()
    };
    ($other:ident, $value:expr) => {
        $value
    };
}

/// The type of a column's slot in [`super::Judged`]: a settled field's value sent, if any;
/// nothing of a column only the site sets; any other column's own type.
macro_rules! judged_type {
    (settled, $ty:ty) => {
        Option<$ty>
    };
    (site, $ty:ty) => {
        ()
    };
    ($other:ident, $ty:ty) => {
        $ty
    };
}

/// A column of the row made from [`super::Judged`] (`$judged`) and what the site stage set
/// (`$site`, [`super::site::SiteColumns`]).
macro_rules! from_judged {
    (settled, $name:ident, $judged:ident, $site:ident) => {
        $site.$name
    };
    (site, $name:ident, $judged:ident, $site:ident) => {
        $site.$name
    };
    ($other:ident, $name:ident, $judged:ident, $site:ident) => {
        $judged.$name
    };
}

/// Declares the row once (see the module doc).
macro_rules! measurement_table {
    (
        <$lt:lifetime> judged with $ctx:ident;
        sent without a column since layout $input_layout:literal {
            $(
                $(#[$iattr:meta])*
                $iname:ident : $ity:ty = optional ( $($irule:tt)* )
            ),* $(,)?
        }
        $(
            layout $layout:literal {
                $(
                    $(#[$attr:meta])*
                    $name:ident : $ty:ty = $kind:ident ( $($rule:tt)* )
                ),* $(,)?
            }
        )*
    ) => {
        /// One measurement of one page view, validated and normalised: a row of
        /// `measurements`, borrowing what it can from the request (`'static` when owned).
        ///
        /// Field names are the column names (`schema/clickhouse/002_measurements.sql`) and,
        /// for request fields, the names in the request body (contract §2 and §3). It is
        /// encoded once, as RowBinary ([`Measurement::encode`]); the JSON form (serde) is
        /// for people: `collector spool dump`, kept-aside files, and spools of the JSON
        /// release.
        #[derive(Debug, Clone, Default, PartialEq, ::serde::Serialize, ::serde::Deserialize)]
        pub struct Measurement<$lt> {
            $($($(#[$attr])* pub $name: $ty,)*)*
        }

        /// One measurement object judged by the table's rules, before any site: every column
        /// that needs no site, the value sent of each `settled` field, and each field sent
        /// without a column (`dimensions`, the site stage's input); with what was dropped on
        /// the way. It borrows its strings from the request body and headers where it can.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Judged<$lt> {
            $(
                $(#[$iattr])*
                pub $iname: Option<$ity>,
            )*
            $($(
                #[doc = concat!("`", stringify!($name), "` ([`Measurement::", stringify!($name), "`]).")]
                pub $name: judged_type!($kind, $ty),
            )*)*
            /// Names of the optional fields that were present but invalid, and dropped.
            pub dropped: Vec<&'static str>,
            /// Whether a present `ts` was outside the accepted skew and stored as NULL.
            pub clock_skewed: bool,
        }

        impl<$lt> Judged<$lt> {
            /// The row: the judged columns, and those the site stage set.
            pub fn into_row(
                self,
                site: $crate::measurement::site::SiteColumns<$lt>,
            ) -> Measurement<$lt> {
                Measurement {
                    $($($name: from_judged!($kind, $name, self, site),)*)*
                }
            }
        }

        /// One measurement object of a body with its request fields undecoded; unknown fields
        /// are skipped, a field sent as `null` is absent. Every column has a slot, named as
        /// the column; the slots of derived columns are never set.
        #[derive(Debug, Default, Clone, Copy)]
        pub struct RawBeacon<$lt> {
            $($(
                #[doc = concat!("`", stringify!($name), "`.")]
                pub $name: Option<&$lt ::serde_json::value::RawValue>,
            )*)*
            $(
                #[doc = concat!("`", stringify!($iname), "` (no column of its own).")]
                pub $iname: Option<&$lt ::serde_json::value::RawValue>,
            )*
        }

        impl<$lt> RawBeacon<$lt> {
            /// Keeps `value` under `key` when the key names a request field (the last
            /// duplicate wins, as in `JSON.parse`).
            pub fn set(&mut self, key: &str, value: &$lt ::serde_json::value::RawValue) {
                let slot = match key {
                    $($(stringify!($name) if is_request!($kind) => &mut self.$name,)*)*
                    $(stringify!($iname) => &mut self.$iname,)*
                    _ => return,
                };
                *slot = (value.get() != "null").then_some(value);
            }
        }

        /// Every field of the row, in table order.
        pub const FIELDS: &[$crate::measurement::FieldSpec] = &[
            $($($crate::measurement::FieldSpec {
                name: stringify!($name),
                kind: field_kind!($kind),
                layout: $layout,
                missing: concat!("missing ", stringify!($name)),
                invalid: concat!("invalid ", stringify!($name)),
            },)*)*
            $($crate::measurement::FieldSpec {
                name: stringify!($iname),
                kind: $crate::measurement::FieldKind::Optional,
                layout: $input_layout,
                missing: concat!("missing ", stringify!($iname)),
                invalid: concat!("invalid ", stringify!($iname)),
            },)*
        ];

        /// The column names, in table (and RowBinary) order.
        pub const COLUMNS: &[&str] = &[$($(stringify!($name),)*)*];

        /// Each layout of the table and how many columns it added, in order.
        pub const LAYOUT_SECTIONS: &[(u16, usize)] =
            &[$(($layout, [$(stringify!($name)),*].len()),)*];

        impl<$lt> Measurement<$lt> {
            /// The columns of a row, in table order: name and ClickHouse type.
            pub fn columns() -> Vec<(&'static str, String)> {
                vec![$($((
                    stringify!($name),
                    <$ty as $crate::measurement::Column>::clickhouse_type(),
                ),)*)*]
            }

            /// Appends this row's RowBinary encoding.
            pub fn encode(&self, out: &mut Vec<u8>) {
                $($($crate::measurement::Column::encode(&self.$name, out);)*)*
            }

            /// The same row, owning every string.
            pub fn into_owned(self) -> Measurement<'static> {
                Measurement {
                    $($($name: $crate::measurement::IntoOwned::into_owned(self.$name),)*)*
                }
            }

            /// Reads one row of the current layout from the front of `input`, advancing it.
            pub fn decode(
                input: &mut &[u8],
            ) -> Result<Measurement<'static>, $crate::measurement::RowDecodeError> {
                Ok(Measurement {
                    $($($name: $crate::measurement::Column::decode(input)?,)*)*
                })
            }

            /// Reads a row of an earlier layout, its first `n` columns in this order and
            /// encoding; the columns after them are their defaults (`None`, empty, 0).
            pub fn decode_prefix(
                input: &mut &[u8],
                n: usize,
            ) -> Result<Measurement<'static>, $crate::measurement::RowDecodeError> {
                let mut k = 0;
                Ok(Measurement {
                    $($($name: {
                        k += 1;
                        if k <= n {
                            $crate::measurement::Column::decode(input)?
                        } else {
                            Default::default()
                        }
                    },)*)*
                })
            }
        }

        /// Judges one measurement object by the table's rules, field by field in table order,
        /// knowing no site: every column that needs no site, what was dropped, and whether a
        /// `ts` was withheld for clock skew. Errors: the first required field missing or
        /// invalid (`missing id`, `invalid url`, ...).
        pub fn judge<$lt>(
            raw: RawBeacon<$lt>,
            $ctx: &$crate::measurement::Context<$lt>,
        ) -> Result<Judged<$lt>, $crate::measurement::Rejection> {
            let mut dropped = Vec::new();
            let mut withheld = false;
            $(
                let $iname: $crate::measurement::Field<$ity> = ($($irule)*)(raw.$iname);
                if matches!($iname, $crate::measurement::Field::Invalid) {
                    dropped.push(stringify!($iname));
                }
            )*
            $($(judge_field!($kind, $name, raw, dropped, withheld, $($rule)*);)*)*
            Ok(Judged {
                $($iname: $iname.stored(),)*
                $($($name: to_judged!($kind, $name),)*)*
                dropped,
                clock_skewed: withheld,
            })
        }
    };
}
