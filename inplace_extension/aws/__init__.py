"""The AWS adapter: the only importer of boto3 and botocore (an import-linter contract says so)."""
