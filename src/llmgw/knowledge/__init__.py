"""Knowledge collections: documents read, split, embedded through the gateway, indexed and searched.

::

    extracting  text from .txt, .md, .html, .pdf
    splitting   passages by headings and paragraphs, with overlap and offsets
    embedding   /v1/embeddings on the cluster's own gateway, the control plane's own key
    ingesting   a document embedded in batches and stored whole
    indexes     a collection's in-memory vectors (and BM25), reciprocal rank fusion
    searching   KnowledgeIndex: the gateway's KnowledgeSearch, and /api's search
    pairs       question/answer pairs with their collection's owner, for training
    service     Knowledge: the parts one control plane holds, made by :func:`knowledge_for`

docs/knowledge.md tells the whole.
"""
