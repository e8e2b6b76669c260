//! `#[derive(FieldTable)]`: the collector's field table (`collector/src/measurement/fields.rs`)
//! is a plain struct, the row; each field says in a `#[field(...)]` attribute what kind it is,
//! its rule and the layout it was added in, and this derive makes from it the code every
//! station reads the table through, so that a field is written down once.
//!
//! On a field (in column order):
//!
//! - `layout = N`: the layout this field, and every field after it until the next `layout`,
//!   was added in (the first field must name one);
//! - one kind: `required = RULE` (a request field the measurement cannot do without; absent,
//!   it rejects the measurement as `missing <name>`, invalid as `invalid <name>`);
//!   `optional = RULE` (dropped alone when invalid, listed in `dropped_fields`); `settled =
//!   RULE` (judged as `optional`, its column set by the site stage from the value sent);
//!   `derived = EXPR` (a column the collector sets); `site` (a column only the site stage
//!   sets). A rule is a function of the field's undecoded value; a rule or expression may name
//!   the context (`ctx`) and any field before it, as judged.
//!
//! On the struct, `#[field(input(NAME: TYPE = RULE), ..., input_layout = N)]`: request fields
//! without a column of their own, judged first (as `optional`) and handed on to the derived
//! columns and the site stage by name.
//!
//! The derive makes, beside the struct (in the module of the struct, which must have `Judged`
//! free): `Judged` and `Judged::into_row`, `RawBeacon` and its setter, `FIELDS`, `COLUMNS`,
//! `LAYOUT_SECTIONS`, `Measurement::{columns, encode, into_owned, decode, decode_prefix}` and
//! `judged_by_the_table` (one object's judgement, field by field in table order).

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::parse::{Parse, ParseStream};
use syn::{parse_macro_input, Attribute, DeriveInput, Expr, Ident, LitInt, Token, Type};

/// What a field is.
enum Kind {
    Required(Expr),
    Optional(Expr),
    Settled(Expr),
    Derived(Expr),
    Site,
}

/// One column of the table.
struct Column {
    name: Ident,
    ty: Type,
    kind: Kind,
    layout: u16,
}

/// One request field without a column.
struct Input {
    name: Ident,
    ty: Type,
    rule: Expr,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let ty: Type = input.parse()?;
        input.parse::<Token![=]>()?;
        let rule: Expr = input.parse()?;
        Ok(Input { name, ty, rule })
    }
}

/// The derive; see the crate doc.
#[proc_macro_derive(FieldTable, attributes(field))]
pub fn field_table(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The attributes `#[field(...)]` among `attrs`.
fn field_attrs(attrs: &[Attribute]) -> impl Iterator<Item = &Attribute> {
    attrs.iter().filter(|a| a.path().is_ident("field"))
}

/// The struct's inputs and their layout.
fn inputs(input: &DeriveInput) -> syn::Result<(Vec<Input>, u16)> {
    let mut inputs = Vec::new();
    let mut layout = 0;
    for attr in field_attrs(&input.attrs) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("input") {
                let content;
                syn::parenthesized!(content in meta.input);
                inputs.push(content.parse()?);
                Ok(())
            } else if meta.path.is_ident("input_layout") {
                layout = meta.value()?.parse::<LitInt>()?.base10_parse()?;
                Ok(())
            } else {
                Err(meta.error("expected `input(NAME: TYPE = RULE)` or `input_layout = N`"))
            }
        })?;
    }
    Ok((inputs, layout))
}

/// The columns, in order.
fn columns(input: &DeriveInput) -> syn::Result<Vec<Column>> {
    let syn::Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "the field table is a struct",
        ));
    };
    let mut columns = Vec::new();
    let mut layout = None;
    for field in &data.fields {
        let name = field.ident.clone().expect("a named field");
        let mut kind = None;
        for attr in field_attrs(&field.attrs) {
            attr.parse_nested_meta(|meta| {
                let path = &meta.path;
                if path.is_ident("layout") {
                    layout = Some(meta.value()?.parse::<LitInt>()?.base10_parse()?);
                } else if path.is_ident("site") {
                    kind = Some(Kind::Site);
                } else {
                    let expr: Expr = meta.value()?.parse()?;
                    kind = Some(if path.is_ident("required") {
                        Kind::Required(expr)
                    } else if path.is_ident("optional") {
                        Kind::Optional(expr)
                    } else if path.is_ident("settled") {
                        Kind::Settled(expr)
                    } else if path.is_ident("derived") {
                        Kind::Derived(expr)
                    } else {
                        return Err(meta.error("expected a kind or `layout = N`"));
                    });
                }
                Ok(())
            })?;
        }
        let kind = kind.ok_or_else(|| syn::Error::new_spanned(&name, "a field needs a kind"))?;
        let layout = layout
            .ok_or_else(|| syn::Error::new_spanned(&name, "the first field needs a layout"))?;
        columns.push(Column {
            name,
            ty: field.ty.clone(),
            kind,
            layout,
        });
    }
    Ok(columns)
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let (inputs, input_layout) = inputs(input)?;
    let columns = columns(input)?;
    let row = &input.ident;
    let generics = &input.generics;
    let lt = generics
        .lifetimes()
        .next()
        .map(|l| l.lifetime.clone())
        .ok_or_else(|| syn::Error::new_spanned(row, "the row borrows: it needs a lifetime"))?;
    let parts = [
        judged(&inputs, &columns, row, &lt),
        raw_beacon(&inputs, &columns, &lt),
        table_consts(&inputs, input_layout, &columns),
        codec(&columns, row, &lt),
        judge(&inputs, &columns, row, &lt),
    ];
    Ok(quote! { #(#parts)* })
}

/// `Judged` and its `into_row`.
fn judged(inputs: &[Input], columns: &[Column], row: &Ident, lt: &syn::Lifetime) -> Tokens {
    let input_fields = inputs.iter().map(|i| {
        let (name, ty) = (&i.name, &i.ty);
        let doc = format!("`{name}` as sent, if valid (no column of its own).");
        quote! { #[doc = #doc] pub #name: Option<#ty>, }
    });
    let fields = columns.iter().filter_map(|c| {
        let (name, ty) = (&c.name, &c.ty);
        let doc = format!("[`{row}::{name}`].");
        match c.kind {
            Kind::Site => None,
            Kind::Settled(_) => Some(quote! { #[doc = #doc] pub #name: Option<#ty>, }),
            _ => Some(quote! { #[doc = #doc] pub #name: #ty, }),
        }
    });
    let into_row = columns.iter().map(|c| {
        let name = &c.name;
        match c.kind {
            Kind::Site | Kind::Settled(_) => quote! { #name: site.#name, },
            _ => quote! { #name: self.#name, },
        }
    });
    quote! {
        /// One measurement object judged by the table's rules, before any site: every column
        /// that needs no site, the value sent of each `settled` field, and each field sent
        /// without a column (the site stage's input); with what was dropped on the way. It
        /// borrows its strings from the request body and headers where it can.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Judged<#lt> {
            #(#input_fields)*
            #(#fields)*
            /// Names of the optional fields that were present but invalid, and dropped.
            pub dropped: Vec<&'static str>,
            /// Whether a present `ts` was outside the accepted skew and stored as NULL.
            pub clock_skewed: bool,
        }

        impl<#lt> Judged<#lt> {
            /// The row: the judged columns, and those the site stage set.
            pub fn into_row(
                self,
                site: crate::measurement::site::SiteColumns<#lt>,
            ) -> #row<#lt> {
                #row { #(#into_row)* }
            }
        }
    }
}

/// `RawBeacon` and its setter.
fn raw_beacon(inputs: &[Input], columns: &[Column], lt: &syn::Lifetime) -> Tokens {
    let slot = |name: &Ident, doc: String| {
        quote! {
            #[doc = #doc]
            pub #name: Option<&#lt ::serde_json::value::RawValue>,
        }
    };
    let column_slots = columns
        .iter()
        .map(|c| slot(&c.name, format!("`{}`.", c.name)));
    let input_slots = inputs
        .iter()
        .map(|i| slot(&i.name, format!("`{}` (no column of its own).", i.name)));
    let sent = columns
        .iter()
        .filter(|c| !matches!(c.kind, Kind::Derived(_) | Kind::Site))
        .map(|c| &c.name)
        .chain(inputs.iter().map(|i| &i.name));
    let keys = sent.clone().map(|n| n.to_string());
    quote! {
        /// One measurement object of a body with its request fields undecoded; unknown fields
        /// are skipped, a field sent as `null` is absent. Every column has a slot, named as
        /// the column; the slots of derived columns are never set.
        #[derive(Debug, Default, Clone, Copy)]
        pub struct RawBeacon<#lt> {
            #(#column_slots)*
            #(#input_slots)*
        }

        impl<#lt> RawBeacon<#lt> {
            /// Keeps `value` under `key` when the key names a request field (the last
            /// duplicate wins, as in `JSON.parse`).
            pub fn set(&mut self, key: &str, value: &#lt ::serde_json::value::RawValue) {
                let slot = match key {
                    #(#keys => &mut self.#sent,)*
                    _ => return,
                };
                *slot = (value.get() != "null").then_some(value);
            }
        }
    }
}

/// `FIELDS`, `COLUMNS` and `LAYOUT_SECTIONS`.
fn table_consts(inputs: &[Input], input_layout: u16, columns: &[Column]) -> Tokens {
    let spec = |name: &Ident, kind: Tokens, layout: u16| {
        let name = name.to_string();
        let missing = format!("missing {name}");
        let invalid = format!("invalid {name}");
        quote! {
            crate::measurement::FieldSpec {
                name: #name,
                kind: crate::measurement::FieldKind::#kind,
                layout: #layout,
                missing: #missing,
                invalid: #invalid,
            },
        }
    };
    let specs = columns.iter().map(|c| {
        let kind = match c.kind {
            Kind::Required(_) => quote!(Required),
            Kind::Optional(_) | Kind::Settled(_) => quote!(Optional),
            Kind::Derived(_) | Kind::Site => quote!(Derived),
        };
        spec(&c.name, kind, c.layout)
    });
    let input_specs = inputs
        .iter()
        .map(|i| spec(&i.name, quote!(Optional), input_layout));
    let names = columns.iter().map(|c| c.name.to_string());
    let mut sections: Vec<(u16, usize)> = Vec::new();
    for c in columns {
        match sections.last_mut() {
            Some((layout, n)) if *layout == c.layout => *n += 1,
            _ => sections.push((c.layout, 1)),
        }
    }
    let sections = sections.iter().map(|(l, n)| quote! { (#l, #n), });
    quote! {
        /// Every field of the row, in table order, then the request fields without a column.
        pub const FIELDS: &[crate::measurement::FieldSpec] = &[#(#specs)* #(#input_specs)*];

        /// The column names, in table (and RowBinary) order.
        pub const COLUMNS: &[&str] = &[#(#names,)*];

        /// Each layout of the table and how many columns it added, in order.
        pub const LAYOUT_SECTIONS: &[(u16, usize)] = &[#(#sections)*];
    }
}

/// The ClickHouse types and the RowBinary codec.
fn codec(columns: &[Column], row: &Ident, lt: &syn::Lifetime) -> Tokens {
    let names: Vec<&Ident> = columns.iter().map(|c| &c.name).collect();
    let types = columns.iter().map(|c| &c.ty);
    let strs = names.iter().map(|n| n.to_string());
    quote! {
        impl<#lt> #row<#lt> {
            /// The columns of a row, in table order: name and ClickHouse type.
            pub fn columns() -> Vec<(&'static str, String)> {
                vec![#((#strs, <#types as crate::measurement::Column>::clickhouse_type()),)*]
            }

            /// Appends this row's RowBinary encoding.
            pub fn encode(&self, out: &mut Vec<u8>) {
                #(crate::measurement::Column::encode(&self.#names, out);)*
            }

            /// The same row, owning every string.
            pub fn into_owned(self) -> #row<'static> {
                #row { #(#names: crate::measurement::IntoOwned::into_owned(self.#names),)* }
            }

            /// Reads one row of the current layout from the front of `input`, advancing it.
            pub fn decode(
                input: &mut &[u8],
            ) -> Result<#row<'static>, crate::measurement::RowDecodeError> {
                Ok(#row { #(#names: crate::measurement::Column::decode(input)?,)* })
            }

            /// Reads a row of an earlier layout, its first `n` columns in this order and
            /// encoding; the columns after them are their defaults (`None`, empty, 0).
            pub fn decode_prefix(
                input: &mut &[u8],
                n: usize,
            ) -> Result<#row<'static>, crate::measurement::RowDecodeError> {
                let mut k = 0;
                Ok(#row {
                    #(#names: {
                        k += 1;
                        if k <= n {
                            crate::measurement::Column::decode(input)?
                        } else {
                            Default::default()
                        }
                    },)*
                })
            }
        }
    }
}

/// One column's judgement: binds the field's name to its judged value, so that the rules of
/// later fields can name it.
fn judge_column(c: &Column) -> Tokens {
    let name = &c.name;
    let missing = format!("missing {name}");
    let invalid = format!("invalid {name}");
    let field = quote!(crate::measurement::Field);
    match &c.kind {
        Kind::Required(rule) => quote! {
            let #name = match (#rule)(raw.#name) {
                #field::Valid(v) => v,
                #field::Absent => return Err(#missing),
                _ => return Err(#invalid),
            };
        },
        Kind::Optional(rule) | Kind::Settled(rule) => {
            let key = name.to_string();
            quote! {
                let #name = (#rule)(raw.#name);
                match &#name {
                    #field::Invalid => dropped.push(#key),
                    #field::Withheld(_) => withheld = true,
                    _ => {}
                }
            }
        }
        Kind::Derived(expr) => quote! { let #name = { #expr }; },
        Kind::Site => quote! {},
    }
}

/// `judged_by_the_table`.
fn judge(inputs: &[Input], columns: &[Column], row: &Ident, lt: &syn::Lifetime) -> Tokens {
    let judge_inputs = inputs.iter().map(|i| {
        let (name, ty, rule) = (&i.name, &i.ty, &i.rule);
        let key = name.to_string();
        quote! {
            let #name: crate::measurement::Field<#ty> = (#rule)(raw.#name);
            if matches!(#name, crate::measurement::Field::Invalid) {
                dropped.push(#key);
            }
        }
    });
    let judge_columns = columns.iter().map(judge_column);
    let input_names = inputs.iter().map(|i| &i.name);
    let fields = columns.iter().filter_map(|c| {
        let name = &c.name;
        match c.kind {
            Kind::Site => None,
            Kind::Optional(_) | Kind::Settled(_) => Some(quote! { #name: #name.stored(), }),
            _ => Some(quote! { #name: #name, }),
        }
    });
    let ctx = format_ident!("ctx");
    let doc = format!(
        "Judges one measurement object by the rules of the field table ([`{row}`]), field by \
         field in table order, knowing no site: every column that needs no site, what was \
         dropped, and whether a `ts` was withheld for clock skew. Errors: the first required \
         field missing or invalid (`missing id`, `invalid url`, ...)."
    );
    quote! {
        #[doc = #doc]
        pub fn judged_by_the_table<#lt>(
            raw: RawBeacon<#lt>,
            #ctx: &crate::measurement::Context<#lt>,
        ) -> Result<Judged<#lt>, crate::measurement::Rejection> {
            let mut dropped = Vec::new();
            let mut withheld = false;
            #(#judge_inputs)*
            #(#judge_columns)*
            Ok(Judged {
                #(#input_names: #input_names.stored(),)*
                #(#fields)*
                dropped,
                clock_skewed: withheld,
            })
        }
    }
}
