"""The mirror across control planes: each plane pulling the blobs it lacks from its peers,
and which caller of FetchBlob may have which blob.
"""
