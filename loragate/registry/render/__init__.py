"""Evidence for people: the markdown a reviewer reads in the Prefect UI and the rows of the
tables the UI and the CLI show. Reads records and rules; decides nothing."""
