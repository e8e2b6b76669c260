//! Page-group presets (`--page-groups-preset`): ordered rules for the URL layouts of the shop
//! platforms our users run, so that a shop gets its page types (home, category, product,
//! cart, checkout, search, account, blog) without writing rules.
//!
//! `collector sites add` and `sites update` expand a preset into the site's rules, after the
//! site's own `--page-group` rules: a user's rule is more specific to the shop than the
//! platform's defaults, and the first match wins, so the user's rules come first.
//!
//! Each preset is tested against a golden list of URLs of that platform (below).

/// The preset names, as `--page-groups-preset` takes them.
pub const NAMES: [&str; 4] = ["shopify", "shopware", "magento", "woocommerce"];

/// The rules of a preset (`NAME=PATTERN`, in order), or `None` for an unknown name.
pub fn rules(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "shopify" => SHOPIFY,
        "shopware" => SHOPWARE,
        "magento" => MAGENTO,
        "woocommerce" => WOOCOMMERCE,
        _ => return None,
    })
}

/// Shopify. Its URL layout is fixed by the platform (Shopify Help Center, "URL structure";
/// theme docs, "Templates"): the home page `/`, collections `/collections/{handle}` (and
/// filtered `/collections/{handle}/{tag}`, the list `/collections`), products
/// `/products/{handle}` and, within a collection, `/collections/{handle}/products/{handle}`,
/// the cart `/cart`, checkout `/checkouts/...` (older shops: `/{shop id}/checkouts/{token}`),
/// search `/search`, customer accounts `/account/...`, blogs `/blogs/{blog}` and articles
/// `/blogs/{blog}/{article}`, pages `/pages/{handle}`, policies `/policies/{name}`.
/// Markets' language folders (`/en-ca/...`) are not covered: add rules for them first.
pub const SHOPIFY: &[&str] = &[
    "home=/",
    "product=/products/*",
    "product=/collections/*/products/*",
    "collection=/collections/**",
    "cart=/cart/**",
    "checkout=/checkouts/**",
    "checkout=/*/checkouts/**",
    "search=/search/**",
    "account=/account/**",
    "blog_article=/blogs/*/*",
    "blog=/blogs/**",
    "page=/pages/*",
    "policy=/policies/*",
];

/// Shopware 6. Storefront routes (Shopware developer docs, "Storefront" routes; SEO URL
/// templates): the cart `/checkout/cart`, checkout `/checkout/confirm`, `/checkout/register`,
/// `/checkout/finish`, search `/search?search=` (suggestions `/suggest`), the account
/// `/account/...`, technical product and category routes `/detail/{id}` and
/// `/navigation/{id}`, shopping experiences `/landingPage/{id}`; and the default SEO URL
/// templates: a product `{name}/{product number}` (`/Main-product/SW10001`), a category its
/// breadcrumb with a trailing slash (`/Clothing/Women/`). Other SEO templates need rules of
/// their own, before the preset's.
pub const SHOPWARE: &[&str] = &[
    "home=/",
    "cart=/checkout/cart/**",
    "checkout=/checkout/**",
    "search=/search/**",
    "search=/suggest/**",
    "account=/account/**",
    "product=/detail/**",
    "category=/navigation/**",
    "landing_page=/landingPage/**",
    "category=/*/",
    "category=/*/*/",
    "category=/*/*/*/",
    "category=/*/*/*/*/",
    "product=/*/*",
];

/// Magento 2 (Adobe Commerce). Routes are `/{front name}/{controller}/{action}` (Adobe
/// Commerce developer docs, "Routing"): the cart `/checkout/cart/`, checkout `/checkout/`
/// (and `/checkout/onepage/success/`), search `/catalogsearch/result/?q=`, the account
/// `/customer/account/...`, orders `/sales/order/...`, the wish list `/wishlist/`, technical
/// catalogue routes `/catalog/product/view/id/{id}` and `/catalog/category/view/id/{id}`; and
/// URL rewrites: products and categories by their URL key with the suffix `.html` (the default
/// of both, "Catalog > SEO"), a product optionally under its category path. A product and a
/// category at the root look alike, so both are `catalog`.
pub const MAGENTO: &[&str] = &[
    "home=/",
    "cart=/checkout/cart/**",
    "checkout=/checkout/**",
    "search=/catalogsearch/**",
    "search=/search/**",
    "account=/customer/**",
    "account=/sales/**",
    "account=/wishlist/**",
    "product=/catalog/product/**",
    "category=/catalog/category/**",
    "blog=/blog/**",
    "contact=/contact/**",
    "catalog=/*.html",
    "product=/*/*.html",
    "product=/*/*/*.html",
    "product=/*/*/*/*.html",
];

/// WooCommerce (on WordPress). Its permalinks (WooCommerce docs, "Permalinks"; WordPress,
/// "Using Permalinks"): products `/product/{slug}/`, categories
/// `/product-category/{slug}/...`, tags `/product-tag/{slug}/`, the shop page `/shop/`, the
/// cart `/cart/`, checkout `/checkout/` (and `/checkout/order-received/{id}/`), the account
/// `/my-account/...`; WordPress's posts under a blog page `/blog/...`, categories
/// `/category/...`, tags `/tag/...`, and dated permalinks `/{yyyy}/{mm}/{dd}/{slug}/`. Search
/// is `/?s=` (the query is not matched: it is the home group).
pub const WOOCOMMERCE: &[&str] = &[
    "home=/",
    "product=/product/**",
    "category=/product-category/**",
    "tag=/product-tag/**",
    "shop=/shop/**",
    "cart=/cart/**",
    "checkout=/checkout/**",
    "account=/my-account/**",
    "blog=/blog/**",
    "blog=/category/**",
    "blog=/tag/**",
    "blog=/*/*/*/*/",
];

#[cfg(test)]
mod tests {
    use super::super::{check, PageGroups};
    use super::*;

    fn assert_golden(preset: &str, golden: &[(&str, &str)]) {
        let rules: Vec<String> = rules(preset)
            .unwrap()
            .iter()
            .map(|r| r.to_string())
            .collect();
        for r in &rules {
            check(r).unwrap_or_else(|e| panic!("{preset}: {r}: {e}"));
        }
        let groups = PageGroups::compile(&rules);
        for (path, group) in golden {
            let url = format!("https://shop.example{path}");
            assert_eq!(groups.group_of(&url), *group, "{preset}: {path}");
        }
    }

    #[test]
    fn every_name_is_a_preset() {
        for n in NAMES {
            assert!(rules(n).is_some());
        }
        assert!(rules("prestashop").is_none());
    }

    #[test]
    fn shopify() {
        assert_golden(
            "shopify",
            &[
                ("/", "home"),
                ("/products/classic-leather-jacket", "product"),
                (
                    "/collections/frontpage/products/classic-leather-jacket",
                    "product",
                ),
                ("/collections/all", "collection"),
                ("/collections/mens-shoes/size-42", "collection"),
                ("/collections", "collection"),
                ("/cart", "cart"),
                ("/checkouts/cn/Z2NwLXVzLWVhc3QxOjAxSjk", "checkout"),
                ("/5521203/checkouts/*", "checkout"),
                ("/search?q=boots", "search"),
                ("/account", "account"),
                ("/account/login", "account"),
                ("/account/orders/*", "account"),
                ("/blogs/news", "blog"),
                ("/blogs/news/summer-lookbook-2026", "blog_article"),
                ("/pages/about-us", "page"),
                ("/policies/refund-policy", "policy"),
                ("/apps/reviews/42", "/apps/reviews/*"),
            ],
        );
    }

    #[test]
    fn shopware() {
        assert_golden(
            "shopware",
            &[
                ("/", "home"),
                ("/Main-product/SW10001", "product"),
                ("/Clothing/", "category"),
                ("/Clothing/Women/", "category"),
                ("/Clothing/Women/Dresses/", "category"),
                ("/detail/0190a1b2c3d4e5f60718293a4b5c6d7e", "product"),
                ("/navigation/0190a1b2c3d4e5f60718293a4b5c6d7e", "category"),
                ("/checkout/cart", "cart"),
                ("/checkout/confirm", "checkout"),
                ("/checkout/finish?orderId=*", "checkout"),
                ("/checkout/register", "checkout"),
                ("/search?search=shirt", "search"),
                ("/account", "account"),
                ("/account/order", "account"),
                ("/account/login", "account"),
                (
                    "/landingPage/0190a1b2c3d4e5f60718293a4b5c6d7e",
                    "landing_page",
                ),
            ],
        );
    }

    #[test]
    fn magento() {
        assert_golden(
            "magento",
            &[
                ("/", "home"),
                ("/breathe-easy-tank.html", "catalog"),
                ("/women.html", "catalog"),
                ("/women/tops-women/breathe-easy-tank.html", "product"),
                ("/gear/bags.html", "product"),
                ("/catalog/product/view/id/1812", "product"),
                ("/catalog/category/view/id/20", "category"),
                ("/checkout/cart/", "cart"),
                ("/checkout/", "checkout"),
                ("/checkout/onepage/success/", "checkout"),
                ("/catalogsearch/result/?q=tank", "search"),
                ("/customer/account/", "account"),
                ("/customer/account/login/", "account"),
                ("/sales/order/history/", "account"),
                ("/wishlist/", "account"),
                ("/contact/", "contact"),
                ("/about-us", "/about-us"),
            ],
        );
    }

    #[test]
    fn woocommerce() {
        assert_golden(
            "woocommerce",
            &[
                ("/", "home"),
                ("/?s=hoodie&post_type=product", "home"),
                ("/product/hoodie-with-logo/", "product"),
                ("/product-category/clothing/", "category"),
                ("/product-category/clothing/hoodies/", "category"),
                ("/product-tag/winter/", "tag"),
                ("/shop/", "shop"),
                ("/shop/page/2/", "shop"),
                ("/cart/", "cart"),
                ("/checkout/", "checkout"),
                ("/checkout/order-received/4711/", "checkout"),
                ("/my-account/", "account"),
                ("/my-account/view-order/4711/", "account"),
                ("/blog/", "blog"),
                ("/category/news/", "blog"),
                ("/2026/12/03/winter-sale/", "blog"),
                ("/sample-page/", "/sample-page/"),
            ],
        );
    }
}
