"""Email sending parts that need no storage: domain names, DKIM keys and
signatures, DNS verification, MIME building and the parsing of delivery
reports."""
