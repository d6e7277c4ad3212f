"""The web portal: static pages (vanilla JS modules, CSS, SVG charts) that call ``/api`` (docs/portal.md)."""
