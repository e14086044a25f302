"""What the registry stores and hands back: adapter versions, pointers, audit events,
golden-set references, validation runs (``adapters``) and the validation report schema
(``reports``). Plain frozen data, built from rows before a connection is released."""
