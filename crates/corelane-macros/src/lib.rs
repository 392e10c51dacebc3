//! `#[corelane::main]` and `#[corelane::test]`: a tokio service's `#[tokio::main]` and
//! `#[tokio::test]`, ported by changing the attribute. Use them through the `corelane` crate,
//! which documents them.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ItemFn, Lit, MetaNameValue, ReturnType, Token};

/// What the attribute said: the interface, the addresses, the core count.
#[derive(Default)]
struct Config {
    iface: Option<String>,
    addrs: Vec<String>,
    cores: Option<usize>,
}

fn parse_config(args: TokenStream) -> syn::Result<Config> {
    let mut c = Config::default();
    let list = Punctuated::<MetaNameValue, Token![,]>::parse_terminated.parse(args)?;
    for kv in list {
        let name = kv
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        let Expr::Lit(ExprLit { lit, .. }) = &kv.value else {
            return Err(syn::Error::new_spanned(
                &kv.value,
                "a literal is expected here",
            ));
        };
        match (name.as_str(), lit) {
            ("iface", Lit::Str(s)) => c.iface = Some(s.value()),
            ("addr", Lit::Str(s)) => c.addrs.extend(
                s.value()
                    .split(',')
                    .map(|a| a.trim().to_string())
                    .filter(|a| !a.is_empty()),
            ),
            ("cores", Lit::Int(n)) => c.cores = Some(n.base10_parse()?),
            _ => {
                return Err(syn::Error::new_spanned(
                    &kv,
                    "expected `iface = \"IF\"`, `addr = \"A/N[,A/N...]\"` or `cores = N`",
                ));
            }
        }
    }
    Ok(c)
}

/// The function, checked to be `async` and to take nothing; its body as an inner `async fn`.
fn body_fn(item: &ItemFn, what: &str) -> syn::Result<(proc_macro2::TokenStream, syn::Ident)> {
    if item.sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            item.sig.fn_token,
            format!("#[corelane::{what}] goes on an `async fn`"),
        ));
    }
    if !item.sig.inputs.is_empty() {
        return Err(syn::Error::new_spanned(
            &item.sig.inputs,
            format!("a #[corelane::{what}] function takes no arguments"),
        ));
    }
    let inner = format_ident!("__corelane_{}", item.sig.ident, span = Span::call_site());
    let (block, output) = (&item.block, &item.sig.output);
    Ok((quote! { async fn #inner() #output #block }, inner))
}

/// Runs an `async fn main` on every core of a corelane runtime, as `#[tokio::main]` runs it
/// once on tokio's. See `corelane::main`.
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    expand_main(args, item).unwrap_or_else(|e| e.to_compile_error().into())
}

fn expand_main(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let c = parse_config(args)?;
    let item: ItemFn = syn::parse(item)?;
    let (body, inner) = body_fn(&item, "main")?;
    let (vis, name, output, attrs) = (&item.vis, &item.sig.ident, &item.sig.output, &item.attrs);
    let iface = match &c.iface {
        Some(i) => quote! { ::core::option::Option::Some(#i) },
        None => quote! { ::core::option::Option::None },
    };
    let addrs = &c.addrs;
    let cores = match c.cores {
        Some(n) => quote! { ::core::option::Option::Some(#n) },
        None => quote! { ::core::option::Option::None },
    };
    let builder = quote! { ::corelane::__macro::builder(#iface, &[#(#addrs),*], #cores) };
    let run = match output {
        // `fn main()`: an error is printed and the process exits with 1.
        ReturnType::Default => quote! {
            let __run = #builder.and_then(|b| b.build()).and_then(|rt| rt.run(|_core| #inner()));
            if let ::core::result::Result::Err(e) = __run {
                ::std::eprintln!("{}: {e}", ::core::stringify!(#name));
                ::std::process::exit(1);
            }
        },
        // `fn main() -> Result<(), E>`: the core's error stops the run; E takes corelane's.
        ReturnType::Type(..) => quote! {
            #builder?.build()?.try_run(|_core| #inner())?;
            ::core::result::Result::Ok(())
        },
    };
    Ok(quote! {
        #(#attrs)*
        #vis fn #name() #output {
            #body
            #run
        }
    }
    .into())
}

/// Runs an `async fn` test in a corelane lab (one core over an in-memory queue, owning
/// 127.0.0.1/8 and ::1: no root, no interface), as `#[tokio::test]` runs it on tokio's. See
/// `corelane::test`.
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    expand_test(args, item).unwrap_or_else(|e| e.to_compile_error().into())
}

fn expand_test(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    if !args.is_empty() {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[corelane::test] takes no arguments (the lab owns 127.0.0.1/8 and ::1; for other \
             addresses use corelane::lab::Lab in a plain #[test])",
        ));
    }
    let item: ItemFn = syn::parse(item)?;
    let (body, inner) = body_fn(&item, "test")?;
    let (vis, name, output, attrs) = (&item.vis, &item.sig.ident, &item.sig.output, &item.attrs);
    Ok(quote! {
        #[::core::prelude::v1::test]
        #(#attrs)*
        #vis fn #name() #output {
            #body
            match ::corelane::lab::run(#inner()) {
                ::core::result::Result::Ok(v) => v,
                ::core::result::Result::Err(e) => ::core::panic!("the corelane lab failed: {e}"),
            }
        }
    }
    .into())
}
