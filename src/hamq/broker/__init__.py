"""The broker: request processors over the store, registration with name servers."""
