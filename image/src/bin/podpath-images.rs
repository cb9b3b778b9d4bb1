//! `podpath-images` on its own. The same program is also one of `podpath`'s: the lab runs it from
//! `podpath`'s binary under this name (see `lab::multicall`).

fn main() {
    image::cli::main()
}
