//! The crate's modules, read from their source, import each other without a circle, and
//! the Kafka and transaction-log layers import nothing above them.
//!
//! A module here is a file (`engine/record.rs`, `kafka/mod.rs`). One file imports another
//! when it names an item of it: in a `use`, or in a path written out in the code
//! (`crate::engine::crash_point(...)`), through `crate::`, `super::`, `self::` or a child
//! module's name. A name re-exported by another module (`crate::Error`, which `lib.rs`
//! takes from `error.rs`) counts as an import of the module that defines it, so the
//! crate root's re-exports tie nothing together. Declaring a child module (`mod batch;`)
//! is not an import. Code that exists only in the crate's own unit tests (`#[cfg(test)]`)
//! is left out: a test may reach anywhere.
//!
//! Why it matters: files in a circle can only be read, changed and tested together; a
//! circle is how the user API and the engine grew into one knot before, see
//! `CHANGELOG.md`. When this test fails it names the files of each circle and what ties
//! them; break the circle by moving the shared names into a module below both.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Module path (segments below the crate root) → the file that holds it.
type Modules = BTreeMap<Vec<String>, PathBuf>;

/// What one file imports from another, with the names it takes.
type Edges = BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>;

struct Crate {
    root: PathBuf,
    modules: Modules,
    /// For each module, the names it re-exports (`pub use`, `pub(crate) use`) and the
    /// full path each stands for.
    reexports: HashMap<Vec<String>, HashMap<String, Vec<String>>>,
    /// For each module, the modules it re-exports everything of (`pub use x::*`).
    glob_reexports: HashMap<Vec<String>, Vec<Vec<String>>>,
    /// Every use of a path, by the module it is written in.
    uses: Vec<(Vec<String>, Vec<String>)>,
}

fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(meta) = attr.parse_args::<syn::Meta>() else {
            return false;
        };
        match &meta {
            syn::Meta::Path(path) => path.is_ident("test") || path.is_ident("doctest"),
            // `all(test, ...)` is test-only; `any(test, feature = "testing")` is not.
            syn::Meta::List(list) if list.path.is_ident("all") => list
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .map(|parts| parts.iter().any(|part| part.path().is_ident("test")))
                .unwrap_or(false),
            _ => false,
        }
    })
}

fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| match &attr.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Every path a use tree stands for, and whether it ends in a glob.
fn flatten(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, String, bool)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                let alias = prefix.last().cloned().unwrap_or_default();
                out.push((prefix.clone(), alias, false));
            } else {
                let mut path = prefix.clone();
                path.push(name.clone());
                out.push((path, name, false));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((path, r.rename.to_string(), false));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), String::new(), true)),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                flatten(item, prefix, out);
            }
        }
    }
}

/// Collects the paths one module's code names, leaving test-only code out.
struct Paths<'a> {
    module: Vec<String>,
    krate: &'a mut Crate,
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if test_only(attrs) {
            return;
        }
        match item {
            syn::Item::Use(u) => {
                let mut paths = Vec::new();
                flatten(&u.tree, &mut Vec::new(), &mut paths);
                let exported = !matches!(u.vis, syn::Visibility::Inherited);
                for (path, alias, glob) in paths {
                    if exported {
                        if glob {
                            self.krate
                                .glob_reexports
                                .entry(self.module.clone())
                                .or_default()
                                .push(path.clone());
                        } else {
                            self.krate
                                .reexports
                                .entry(self.module.clone())
                                .or_default()
                                .insert(alias, path.clone());
                        }
                    }
                    // A re-export is the module's face, not a use of it: what the
                    // module's own code takes from it is counted where the code names it.
                    if !exported {
                        self.krate.uses.push((self.module.clone(), path));
                    }
                }
            }
            // A module written inline is read as part of its file, under its own path.
            syn::Item::Mod(m) if m.content.is_some() => {
                self.module.push(m.ident.to_string());
                for item in &m.content.as_ref().expect("inline").1 {
                    self.visit_item(item);
                }
                self.module.pop();
            }
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item
            && test_only(&f.attrs)
        {
            return;
        }
        syn::visit::visit_impl_item(self, item);
    }

    // `pub(crate)`, `pub(super)`: visibility, not an import.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.krate.uses.push((self.module.clone(), segments));
        syn::visit::visit_path(self, path);
    }

    // A macro's tokens are not parsed; paths in `format!` and the like are rare and
    // their items are imported by a `use` as well.
}

impl Crate {
    fn read(root: &Path) -> Crate {
        let mut krate = Crate {
            root: root.to_path_buf(),
            modules: Modules::new(),
            reexports: HashMap::new(),
            glob_reexports: HashMap::new(),
            uses: Vec::new(),
        };
        krate.read_module(Vec::new(), root.join("lib.rs"));
        krate
    }

    fn read_module(&mut self, module: Vec<String>, file: PathBuf) {
        let source =
            fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let parsed =
            syn::parse_file(&source).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        self.modules.insert(module.clone(), file.clone());
        // Where this file's child modules live.
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let dir = if module.is_empty() || name == "mod" {
            file.parent().expect("a parent").to_path_buf()
        } else {
            file.with_extension("")
        };
        let mut children = Vec::new();
        collect_children(
            &parsed.items,
            &module,
            &dir,
            &mut children,
            &mut self.modules,
            &file,
        );
        Paths {
            module,
            krate: self,
        }
        .visit_file(&parsed);
        for (child, path) in children {
            self.read_module(child, path);
        }
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.modules.contains_key(path)
    }

    /// The module that defines what `path`, written in `module`, names; `None` for what
    /// lies outside the crate or inside the module itself.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        if depth > 16 || path.is_empty() || (path.len() < 2 && path[0] != "super") {
            return None;
        }
        let (mut base, rest): (Vec<String>, &[String]) = match path[0].as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (module.to_vec(), &path[1..]),
            "super" => {
                let mut base = module.to_vec();
                let mut rest = path;
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            // A child module's name starts a path only with more after it: alone, the
            // same name is a local variable (`batch.commit()` beside `mod batch;`).
            first if path.len() > 1 => {
                let mut child = module.to_vec();
                child.push(first.to_string());
                if self.is_module(&child) {
                    (module.to_vec(), path)
                } else {
                    return None;
                }
            }
            _ => return None,
        };
        let mut rest = rest;
        while let Some(next) = rest.first() {
            let mut child = base.clone();
            child.push(next.clone());
            if self.is_module(&child) {
                base = child;
                rest = &rest[1..];
            } else {
                break;
            }
        }
        // A name the module only re-exports is defined where it comes from.
        if let Some(name) = rest.first() {
            if let Some(target) = self.reexports.get(&base).and_then(|r| r.get(name)) {
                let mut target = target.clone();
                target.extend(rest[1..].iter().cloned());
                if let Some(found) = self.resolve(&base, &target, depth + 1) {
                    return Some(found);
                }
            }
            for glob in self.glob_reexports.get(&base).into_iter().flatten() {
                let mut target = glob.clone();
                target.extend(rest.iter().cloned());
                if let Some(found) = self.resolve(&base, &target, depth + 1)
                    && found != base
                {
                    return Some(found);
                }
            }
        }
        Some(base)
    }

    /// Which file imports which, with the names taken.
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (module, path) in &self.uses {
            // A name the module re-exports, used in its own code, is a use of where
            // the name comes from.
            let path = match self.reexports.get(module).and_then(|r| r.get(&path[0])) {
                Some(target)
                    if path.len() == 1
                        || !self.is_module(&[module.clone(), vec![path[0].clone()]].concat()) =>
                {
                    let mut full = target.clone();
                    full.extend(path[1..].iter().cloned());
                    full
                }
                _ => path.clone(),
            };
            let Some(target) = self.resolve(module, &path, 0) else {
                continue;
            };
            let from = self.file_of(module);
            let to = self.file_of(&target);
            if from == to {
                continue;
            }
            let name = path.last().cloned().unwrap_or_default();
            edges
                .entry(from)
                .or_default()
                .entry(to)
                .or_default()
                .insert(name);
        }
        edges
    }

    /// The file a module is written in (an inline module is in its parent's file).
    fn file_of(&self, module: &[String]) -> PathBuf {
        let mut module = module.to_vec();
        loop {
            if let Some(file) = self.modules.get(&module) {
                return file.strip_prefix(&self.root).unwrap_or(file).to_path_buf();
            }
            module.pop();
        }
    }
}

fn collect_children(
    items: &[syn::Item],
    module: &[String],
    dir: &Path,
    out: &mut Vec<(Vec<String>, PathBuf)>,
    modules: &mut Modules,
    file: &Path,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if test_only(&m.attrs) {
            continue;
        }
        let mut child = module.to_vec();
        child.push(m.ident.to_string());
        match &m.content {
            Some((_, inner)) => {
                modules.insert(child.clone(), file.to_path_buf());
                collect_children(
                    inner,
                    &child,
                    &dir.join(m.ident.to_string()),
                    out,
                    modules,
                    file,
                );
            }
            None => {
                let path = match path_attribute(&m.attrs) {
                    Some(p) => dir.join(p),
                    None => {
                        let flat = dir.join(format!("{}.rs", m.ident));
                        if flat.exists() {
                            flat
                        } else {
                            dir.join(m.ident.to_string()).join("mod.rs")
                        }
                    }
                };
                out.push((child, path));
            }
        }
    }
}

/// The circles among files: strongly connected sets of more than one file (Tarjan).
fn circles(edges: &Edges) -> Vec<Vec<PathBuf>> {
    struct Search<'a> {
        edges: &'a Edges,
        index: HashMap<&'a PathBuf, usize>,
        low: HashMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        next: usize,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a PathBuf) {
            self.index.insert(node, self.next);
            self.low.insert(node, self.next);
            self.next += 1;
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.edges.get(node).into_iter().flat_map(|m| m.keys()) {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[next].min(self.low[node]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.index[next].min(self.low[node]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut circle = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    circle.push(top.clone());
                    if top == node {
                        break;
                    }
                }
                if circle.len() > 1 {
                    circle.sort();
                    self.found.push(circle);
                }
            }
        }
    }
    let mut search = Search {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    let nodes: BTreeSet<&PathBuf> = edges
        .iter()
        .flat_map(|(from, to)| std::iter::once(from).chain(to.keys()))
        .collect();
    for node in nodes {
        if !search.index.contains_key(node) {
            search.visit(node);
        }
    }
    search.found
}

fn describe(edges: &Edges, circles: &[Vec<PathBuf>]) -> String {
    let mut text = String::new();
    for (n, circle) in circles.iter().enumerate() {
        text.push_str(&format!("circle {}: {} files\n", n + 1, circle.len()));
        for from in circle {
            for (to, names) in edges.get(from).into_iter().flatten() {
                if circle.contains(to) {
                    text.push_str(&format!("  {}\n", edge_line(from, to, names)));
                }
            }
        }
    }
    text
}

/// `from -> to: the, names, taken`.
fn edge_line(from: &Path, to: &Path, names: &BTreeSet<String>) -> String {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    format!(
        "{} -> {}: {}",
        from.display(),
        to.display(),
        names.join(", ")
    )
}

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_two_modules_import_each_other_even_by_a_detour() {
    let krate = Crate::read(&source_dir());
    assert!(
        krate.modules.len() > 40,
        "only {} modules found",
        krate.modules.len()
    );
    let edges = krate.edges();
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "the crate's modules import each other in a circle:\n{}",
        describe(&edges, &found)
    );
}

/// The modules everything may stand on: the error type, the names onceflow writes on the
/// wire, the clock, redaction, crash points, the blocking-call boundary and the state
/// store's seam. Each imports only others of these.
const LEAVES: [&str; 7] = [
    "error.rs",
    "wire.rs",
    "clock.rs",
    "redact.rs",
    "crash.rs",
    "blocking.rs",
    "state.rs",
];

fn is_leaf(file: &Path) -> bool {
    LEAVES.iter().any(|leaf| file == Path::new(leaf))
}

/// The imports of the files `from` picks that go where `allowed` does not let them, one
/// line each.
fn imports_outside(
    edges: &Edges,
    from: impl Fn(&Path) -> bool,
    allowed: impl Fn(&Path, &Path) -> bool,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (file, targets) in edges.iter().filter(|(file, _)| from(file)) {
        for (to, names) in targets {
            if !allowed(file, to) {
                wrong.push(edge_line(file, to, names));
            }
        }
    }
    wrong
}

#[test]
fn the_leaf_modules_import_only_each_other() {
    let krate = Crate::read(&source_dir());
    for leaf in LEAVES {
        assert!(
            krate.modules.values().any(|file| file.ends_with(leaf)),
            "no leaf module {leaf}"
        );
    }
    let wrong = imports_outside(&krate.edges(), is_leaf, |_, to| is_leaf(to));
    assert!(
        wrong.is_empty(),
        "leaf modules import from above them:\n{}",
        wrong.join("\n")
    );
}

/// What the layers at the bottom may import: the Kafka client layer and the transaction
/// log sit on the leaf modules only, never on the engine, the user API or each other.
#[test]
fn the_kafka_and_transaction_log_layers_import_only_leaf_modules() {
    let layer = |file: &Path| ["kafka", "txlog"].into_iter().find(|l| file.starts_with(l));
    let wrong = imports_outside(
        &Crate::read(&source_dir()).edges(),
        |file| layer(file).is_some(),
        |from, to| layer(to) == layer(from) || is_leaf(to),
    );
    assert!(
        wrong.is_empty(),
        "kafka/ and txlog/ import from above them:\n{}",
        wrong.join("\n")
    );
}

/// The files whose own code names the crate `name` (`rdkafka::...`, `use redb::...`).
fn users_of(krate: &Crate, name: &str) -> BTreeSet<PathBuf> {
    krate
        .uses
        .iter()
        .filter(|(_, path)| path.first().map(String::as_str) == Some(name))
        .map(|(module, _)| krate.file_of(module))
        .collect()
}

/// rdkafka is named in the Kafka client layer only, redb in the transaction log only:
/// every Kafka client (the engine's, the effect executor's marker producer, half
/// messages, the outbox relay, `dlq replay`) is one of `kafka/`'s types.
#[test]
fn rdkafka_is_named_only_under_kafka_and_redb_only_under_txlog() {
    let krate = Crate::read(&source_dir());
    let rdkafka = users_of(&krate, "rdkafka");
    assert!(
        rdkafka.iter().any(|file| file.starts_with("kafka")),
        "{rdkafka:?}"
    );
    let outside: Vec<&PathBuf> = rdkafka.iter().filter(|f| !f.starts_with("kafka")).collect();
    assert!(
        outside.is_empty(),
        "rdkafka named outside kafka/: {outside:?}"
    );
    let redb = users_of(&krate, "redb");
    assert!(!redb.is_empty());
    let outside: Vec<&PathBuf> = redb.iter().filter(|f| !f.starts_with("txlog")).collect();
    assert!(outside.is_empty(), "redb named outside txlog/: {outside:?}");
}

/// Test infrastructure lives in `onceflow-testkit`, not in the product: the product's
/// dependencies hold no container library and nothing that was there only for tests, and
/// its only `unsafe` is the one call librdkafka offers no safe binding for (the testkit's
/// exit hook was the other).
#[test]
fn the_product_crate_has_no_test_only_dependency_and_no_unsafe() {
    const TEST_ONLY: [&str; 4] = ["testcontainers", "rcgen", "libc", "proptest"];
    const FFI: &str = "kafka/topic_id.rs";
    let manifest = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .expect("Cargo.toml");
    let dependencies: Vec<&str> = manifest
        .lines()
        .skip_while(|line| line.trim() != "[dependencies]")
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .filter_map(|line| line.split(['=', ' ', '.']).next())
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(dependencies.contains(&"rdkafka"), "{dependencies:?}");
    let test_only: Vec<&&str> = dependencies
        .iter()
        .filter(|name| TEST_ONLY.contains(name))
        .collect();
    assert!(
        test_only.is_empty(),
        "test-only dependencies: {test_only:?}"
    );

    struct Unsafe(usize);
    impl Visit<'_> for Unsafe {
        fn visit_expr_unsafe(&mut self, _: &syn::ExprUnsafe) {
            self.0 += 1;
        }
        fn visit_signature(&mut self, signature: &syn::Signature) {
            self.0 += usize::from(signature.unsafety.is_some());
        }
        fn visit_item_impl(&mut self, item: &syn::ItemImpl) {
            self.0 += usize::from(item.unsafety.is_some());
            syn::visit::visit_item_impl(self, item);
        }
    }
    let mut dirs = vec![source_dir()];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("source directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).expect("source");
                let file = syn::parse_file(&text).expect("parses");
                let mut found = Unsafe(0);
                found.visit_file(&file);
                let relative = path.strip_prefix(source_dir()).expect("below src");
                if relative != Path::new(FFI) {
                    assert_eq!(found.0, 0, "`unsafe` in {}", relative.display());
                } else {
                    assert!(found.0 > 0, "{FFI} has no `unsafe` now: take it off");
                }
                files += 1;
            }
        }
    }
    assert!(files > 50, "only {files} files read");
}

/// Crates whose types must not show in the public API: a user would depend on their
/// versions through onceflow's, and onceflow could not change client or store without
/// breaking its users. sqlx is the outbox's on purpose: the outbox joins the user's own
/// database transaction, which is the user's sqlx connection (re-exported, so the
/// versions match).
const FOREIGN: [&str; 5] = ["rdkafka", "redb", "testcontainers", "tempfile", "sqlx"];
const FOREIGN_ALLOWED: [(&str, &str); 1] = [("outbox.rs", "sqlx")];

/// The public items of one file that name a foreign crate's type: `pub` functions and
/// methods (arguments and result), fields, variants, aliases, constants and re-exports,
/// and trait impls whose trait takes a foreign type (`impl From<KafkaError> for Error`).
/// `pub` means public here: the crate denies `unreachable_pub` in CI.
fn foreign_in_public(text: &str) -> Vec<(String, String)> {
    #[derive(Default)]
    struct Finder {
        /// Names brought in by `use`, and the crate each comes from.
        imported: HashMap<String, String>,
        found: Vec<(String, String)>,
        item: String,
    }
    impl Finder {
        fn crate_of(&self, path: &syn::Path) -> Option<String> {
            let first = path.segments.first()?.ident.to_string();
            if FOREIGN.contains(&first.as_str()) {
                return Some(first);
            }
            self.imported
                .get(&first)
                .filter(|krate| FOREIGN.contains(&krate.as_str()))
                .cloned()
        }
        fn check_type(&mut self, ty: &syn::Type) {
            struct Types<'a>(&'a Finder, Vec<String>);
            impl Visit<'_> for Types<'_> {
                fn visit_path(&mut self, path: &syn::Path) {
                    if let Some(krate) = self.0.crate_of(path) {
                        self.1.push(krate);
                    }
                    syn::visit::visit_path(self, path);
                }
            }
            let mut types = Types(self, Vec::new());
            types.visit_type(ty);
            let crates = types.1;
            for krate in crates {
                self.found.push((self.item.clone(), krate));
            }
        }
        fn check_signature(&mut self, name: String, signature: &syn::Signature) {
            self.item = name;
            for input in &signature.inputs {
                if let syn::FnArg::Typed(arg) = input {
                    self.check_type(&arg.ty);
                }
            }
            if let syn::ReturnType::Type(_, ty) = &signature.output {
                self.check_type(ty);
            }
        }
        fn check_fields(&mut self, name: String, fields: &syn::Fields, all: bool) {
            self.item = name;
            for field in fields {
                if all || matches!(field.vis, syn::Visibility::Public(_)) {
                    self.check_type(&field.ty);
                }
            }
        }
    }
    /// The names `tree` brings in, and the crate each comes from (the module graph's
    /// own [`flatten`]).
    fn imports(tree: &syn::UseTree, into: &mut HashMap<String, String>) {
        let mut paths = Vec::new();
        flatten(tree, &mut Vec::new(), &mut paths);
        for (path, name, glob) in paths {
            if let (false, Some(first)) = (glob, path.first()) {
                into.insert(name, first.clone());
            }
        }
    }
    fn public(vis: &syn::Visibility) -> bool {
        matches!(vis, syn::Visibility::Public(_))
    }
    fn walk(finder: &mut Finder, items: &[syn::Item]) {
        for item in items {
            if let syn::Item::Use(u) = item {
                imports(&u.tree, &mut finder.imported);
            }
        }
        for item in items {
            match item {
                syn::Item::Fn(f) if public(&f.vis) && !test_only(&f.attrs) => {
                    finder.check_signature(f.sig.ident.to_string(), &f.sig);
                }
                syn::Item::Struct(s) if public(&s.vis) && !test_only(&s.attrs) => {
                    finder.check_fields(s.ident.to_string(), &s.fields, false);
                }
                syn::Item::Enum(e) if public(&e.vis) && !test_only(&e.attrs) => {
                    for variant in &e.variants {
                        let name = format!("{}::{}", e.ident, variant.ident);
                        finder.check_fields(name, &variant.fields, true);
                    }
                }
                syn::Item::Type(t) if public(&t.vis) => {
                    finder.item = t.ident.to_string();
                    finder.check_type(&t.ty);
                }
                syn::Item::Const(c) if public(&c.vis) => {
                    finder.item = c.ident.to_string();
                    finder.check_type(&c.ty);
                }
                syn::Item::Use(u) if public(&u.vis) => {
                    let mut names = HashMap::new();
                    imports(&u.tree, &mut names);
                    for (name, krate) in names {
                        if FOREIGN.contains(&krate.as_str()) {
                            finder.found.push((format!("pub use {name}"), krate));
                        }
                    }
                }
                syn::Item::Impl(i) if !test_only(&i.attrs) => {
                    let self_name = quote_type(&i.self_ty);
                    if let Some((_, trait_path, _)) = &i.trait_ {
                        finder.item = format!("impl {} for {self_name}", quote_path(trait_path));
                        for segment in &trait_path.segments {
                            if let syn::PathArguments::AngleBracketed(args) = &segment.arguments {
                                for arg in &args.args {
                                    if let syn::GenericArgument::Type(ty) = arg {
                                        finder.check_type(ty);
                                    }
                                }
                            }
                        }
                    } else {
                        for impl_item in &i.items {
                            if let syn::ImplItem::Fn(f) = impl_item
                                && public(&f.vis)
                                && !test_only(&f.attrs)
                            {
                                let name = format!("{self_name}::{}", f.sig.ident);
                                finder.check_signature(name, &f.sig);
                            }
                        }
                    }
                }
                syn::Item::Mod(m) if !test_only(&m.attrs) => {
                    if let Some((_, items)) = &m.content {
                        walk(finder, items);
                    }
                }
                _ => {}
            }
        }
    }
    fn quote_path(path: &syn::Path) -> String {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        segments.join("::")
    }
    fn quote_type(ty: &syn::Type) -> String {
        match ty {
            syn::Type::Path(p) => quote_path(&p.path),
            _ => "_".into(),
        }
    }
    let file = syn::parse_file(text).expect("parses");
    let mut finder = Finder::default();
    walk(&mut finder, &file.items);
    finder.found.sort();
    finder.found.dedup();
    finder.found
}

/// No foreign type in the public API: what users compile against is onceflow's own
/// (errors carry `KafkaCode`, not librdkafka's code), so a new rdkafka or redb is not a
/// breaking change for them. The outbox's sqlx is the one exception ([`FOREIGN`]).
#[test]
fn no_foreign_type_in_the_public_api() {
    let root = source_dir();
    let mut dirs = vec![root.clone()];
    let mut found = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("source directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(&root).expect("below src").to_path_buf();
                let text = fs::read_to_string(&path).expect("source");
                for (item, krate) in foreign_in_public(&text) {
                    let file = relative.to_string_lossy().into_owned();
                    if !FOREIGN_ALLOWED.contains(&(file.as_str(), krate.as_str())) {
                        found.push(format!("{file}: {item} names {krate}"));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "foreign types in the public API:\n{}",
        found.join("\n")
    );
}

/// The check finds what the issue found (`impl From<RDKafkaErrorCode> for Error`), a
/// foreign type through an import, a re-export and a public field, and passes what is
/// not public.
#[test]
fn the_public_api_check_finds_foreign_types_and_passes_private_ones() {
    let found = foreign_in_public(
        r#"
        use rdkafka::error::RDKafkaErrorCode;
        use redb::Database as Db;
        pub use rdkafka::ClientConfig;
        pub struct Store { pub db: Db, inner: rdkafka::TopicPartitionList }
        impl From<RDKafkaErrorCode> for Error { fn from(_: RDKafkaErrorCode) -> Self { todo!() } }
        pub(crate) fn private(_: RDKafkaErrorCode) {}
        impl Store { pub fn open(&self) -> Option<&Db> { None } fn hidden(_: Db) {} }
        pub fn fine(_: &str) -> crate::Error { todo!() }
        #[cfg(test)]
        mod tests { pub fn helper(_: rdkafka::ClientConfig) {} }
        "#,
    );
    let found: Vec<String> = found
        .into_iter()
        .map(|(item, krate)| format!("{item}: {krate}"))
        .collect();
    assert_eq!(
        found,
        [
            "Store: redb",
            "Store::open: redb",
            "impl From for Error: rdkafka",
            "pub use ClientConfig: rdkafka",
        ]
    );
}

/// The check itself finds a circle through a detour and a re-export, and passes a tree
/// without one; without this, a reader that sees no imports would pass any crate.
#[test]
fn the_check_finds_a_circle_through_a_reexport_and_passes_a_tree_without_one() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    fs::create_dir_all(src.join("engine")).unwrap();
    fs::write(
        src.join("lib.rs"),
        "mod engine;\nmod api;\nmod leaf;\npub use api::Context;\n",
    )
    .unwrap();
    fs::write(src.join("leaf.rs"), "pub struct Leaf;\n").unwrap();
    fs::write(
        src.join("engine/mod.rs"),
        "mod batch;\npub use batch::Batch;\npub fn run() -> Option<Batch> { None }\n",
    )
    .unwrap();
    // batch -> lib's re-export (which is api.rs) -> engine/mod.rs -> batch: a circle.
    fs::write(
        src.join("engine/batch.rs"),
        "use crate::Context;\nuse crate::leaf::Leaf;\npub struct Batch(Context, Leaf);\n\
         #[cfg(test)]\nmod tests { use crate::engine::run; }\n",
    )
    .unwrap();
    fs::write(
        src.join("api.rs"),
        "pub struct Context;\npub fn go() { crate::engine::run() }\n",
    )
    .unwrap();
    let edges = Crate::read(src).edges();
    let found = circles(&edges);
    assert_eq!(
        found,
        vec![vec![
            PathBuf::from("api.rs"),
            PathBuf::from("engine/batch.rs"),
            PathBuf::from("engine/mod.rs"),
        ]],
        "{edges:#?}"
    );

    // The same tree with the engine no longer reaching up: no circle.
    fs::write(
        src.join("api.rs"),
        "pub struct Context;\n#[cfg(test)]\nfn go() { crate::engine::run() }\n",
    )
    .unwrap();
    let edges = Crate::read(src).edges();
    assert_eq!(circles(&edges), Vec::<Vec<PathBuf>>::new(), "{edges:#?}");
}
